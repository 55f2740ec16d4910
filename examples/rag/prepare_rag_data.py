"""Prepare the RAG example's data: HotpotQA questions (``hotpotqa/hotpot_qa``) for multi-hop retrieval.

Rows become ``{"question", "answer", "type", "level", "supporting_titles", "task_id", "data_source"}``
(the gold paragraphs are never in the row the agent sees: it has to retrieve them). Train: the
``train`` split; test: ``validation``. Written as ``<out-dir>/{train,test}.jsonl`` and registered as
rLLM dataset ``strands_rag`` when rLLM is installed (``--verl-out [DIR]``: also as verl parquet for
``train_rag_verl.sh``). The retrieval server must serve a corpus that
contains the answers (README: the full Wikipedia index; ``--sample`` pairs with the shipped corpus).

    python examples/rag/prepare_rag_data.py --limit 20000 --cache-dir /data/hf --download-corpus /data/wiki18
    python examples/rag/prepare_rag_data.py --sample     # shipped questions over the shipped corpus, offline
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from agentboost.data_prep import (
    add_common_arguments,
    convert_rows,
    file_rows,
    hub_rows,
    verl_out_dir,
    write_dataset,
    write_verl_dataset,
)
from agentboost.environments.rag_env import SYSTEM_PROMPT
from agentboost.retrieval.corpus import SAMPLE_QUESTIONS, SHIPPED_CORPUS, read_corpus

DATASET = "hotpotqa/hotpot_qa"
CORPUS_REPO, CORPUS_FILE = "PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz"
"""The 2018 Wikipedia passages (DPR's 100-word split, 21M) as Search-R1 publishes them on the Hub."""

logger = logging.getLogger("prepare_rag_data")


def download_corpus(directory: str, *, repo: str = CORPUS_REPO, filename: str = CORPUS_FILE) -> Path:
    """Fetch the Wikipedia corpus into ``directory`` (Hub download: resumable, skipped when present)."""
    from huggingface_hub import hf_hub_download

    path = Path(hf_hub_download(repo_id=repo, filename=filename, repo_type="dataset", local_dir=directory))
    logger.info("corpus: %s (%.1f GB); next: python -m agentboost.retrieval.build_index --corpus %s --out DIR "
                "--device cuda --fp16", path, path.stat().st_size / 1e9, path)  # fmt: skip
    return path


def sample_titles() -> dict[str, str]:
    """Document id -> title of the shipped corpus (the sample rows name their supporting documents by id)."""
    return {doc["id"]: doc["title"] for doc in read_corpus(SHIPPED_CORPUS)}


def converter(source: str, titles: dict[str, str] | None = None):
    """Row converter for HotpotQA rows (``supporting_facts``) and the shipped sample (``supporting_ids``)."""

    def convert(row: dict[str, Any], index: int) -> dict[str, Any] | None:
        question, answer = row.get("question"), row.get("answer")
        if not isinstance(question, str) or not question.strip() or not isinstance(answer, str) or not answer.strip():
            return None
        facts = row.get("supporting_facts") or {}
        supporting = sorted(set(facts.get("title") or [])) if isinstance(facts, dict) else []
        if not supporting and titles is not None:
            supporting = [titles.get(str(i), str(i)) for i in row.get("supporting_ids") or []]
        return {
            "question": question.strip(),
            "answer": answer.strip(),
            "type": row.get("type"),
            "level": row.get("level"),
            "supporting_titles": supporting,
            "task_id": f"{source}-{row.get('id', index)}",
            "data_source": source,
        }

    return convert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, default_out="data/strands_rag")
    parser.add_argument("--config", default="fullwiki", choices=["fullwiki", "distractor"])
    parser.add_argument(
        "--retrieval-url", default=None, help="store this server URL in every row (else: $AGENTBOOST_RETRIEVAL_URL)"
    )
    parser.add_argument(
        "--download-corpus", metavar="DIR", default=None,
        help=f"also download the Wikipedia corpus ({CORPUS_REPO}: {CORPUS_FILE}, several GB) into DIR",
    )  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.download_corpus:
        download_corpus(args.download_corpus)
    splits = {}
    for split, hub_split in (("train", "train"), ("test", "validation")):
        if args.sample:  # the same shipped questions in both splits: a smoke test, not a benchmark
            raw = file_rows(SAMPLE_QUESTIONS)
        else:
            raw = hub_rows(DATASET, config=args.config, split=hub_split, cache_dir=args.cache_dir, limit=args.limit)
        source = "sample" if args.sample else f"hotpotqa-{hub_split}"
        splits[split] = convert_rows(
            raw, converter(source, sample_titles() if args.sample else None), limit=args.limit, desc=source
        )
        if args.retrieval_url:
            for row in splits[split]:
                row["retrieval_url"] = args.retrieval_url
    write_dataset("strands_rag", splits, args.out_dir, register=args.register)
    verl_dir = verl_out_dir(args)
    if verl_dir is not None:
        write_verl_dataset(splits, verl_dir, system_prompt=SYSTEM_PROMPT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
