"""Sequences, optionals, strings and text features.

A sequence is a handle in the IR (passes/ir.py HANDLE_DTYPES: 0 bytes of its own, length
unknown); the tensors it holds are counted where they are written. So the ops that build a
sequence count the tensors they copy into it as written (``writes="inputs"``), the ops that
take a tensor out of one read what they return (``reads="outputs"``), and the rest move a
handle. An optional value is its element's spec: wrapping and unwrapping one is a view.
Strings have no fixed size (0 bits per element in the IR): string ops move 0 counted bytes.
"""
from __future__ import annotations

from ..costs.registry import OpView, rule, zero_cost

FAMILY = "sequence"

zero_cost("SequenceConstruct", "SequenceInsert", "SplitToSequence",
          reason="builds a sequence: copies its input tensors into it", writes="inputs",
          family=FAMILY)
zero_cost("SequenceAt", "ConcatFromSequence",
          reason="reads tensors out of a sequence: reads what it returns", reads="outputs",
          family=FAMILY)
zero_cost("SequenceEmpty", "SequenceErase", "SequenceLength", "OptionalHasElement",
          reason="moves a sequence handle or reads its metadata only", reads="none",
          family=FAMILY)
zero_cost("Optional", "OptionalGetElement",
          reason="view: an optional value is its element", alias=True, family=FAMILY)
zero_cost("SequenceMap",
          reason="control flow: the body's nodes are costed as nodes of their own",
          reads="none", family="control", bodies=True)
zero_cost("StringConcat", "StringNormalizer", "StringSplit", "RegexFullMatch",
          reason="string processing: character operations, no arithmetic (strings count 0 "
                 "bytes)", family=FAMILY)


@rule("TfIdfVectorizer", saves="nothing")
def tfidf(op: OpView) -> tuple[int, int]:
    # Every input position starts one n-gram per length from min to max_gram_length (at most;
    # max_skip_count repeats that per skip): one pool lookup each; then one TF / IDF / TF-IDF
    # weighting per output element.
    grams = int(op.attr("max_gram_length", 1)) - int(op.attr("min_gram_length", 1)) + 1
    skips = int(op.attr("max_skip_count", 0)) + 1
    return 0, op.in_numel(0) * grams * skips + op.out_numel(0)
