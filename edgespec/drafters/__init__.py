"""Drafters propose the tokens the target verifies. Every drafter speaks the one interface in ``base``."""

from .base import Draft, Drafter
from .draft_model import DraftModelDrafter
from .ngram import NgramDrafter
from .recycled import RecycledDrafter
from .suffix import OutputStore, SuffixDrafter

__all__ = ["Draft", "DraftModelDrafter", "Drafter", "NgramDrafter", "OutputStore", "RecycledDrafter", "SuffixDrafter"]
