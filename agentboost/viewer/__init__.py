"""Reading episodes as a person does: a self-contained HTML viewer (``agentboost view``) and the rows
of W&B trajectory tables."""

from .page import Caps, page_data, render, write_page
from .rows import TABLE_COLUMNS, log_trajectory_table, trajectory_rows
from .source import Source, load, tokenizer_ref
from .tokens import PieceDecoder, TokenView, open_tokenizer, token_view

__all__ = [
    "TABLE_COLUMNS",
    "Caps",
    "PieceDecoder",
    "Source",
    "TokenView",
    "load",
    "log_trajectory_table",
    "open_tokenizer",
    "page_data",
    "render",
    "token_view",
    "tokenizer_ref",
    "trajectory_rows",
    "write_page",
]
