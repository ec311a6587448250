"""A strategy variant priced as if it ran alone: no discount from a prefix another variant computed.

Backends reuse prompt prefixes: the transformers backend groups a call's prompts by a common
token prefix and keeps document prefixes across calls, the fake backend keeps declared prefixes,
a server caches prefixes of whatever it was sent. So in a run of several strategies, Self-Route's
RAG prompt (the same chunks as RAG's, one option more) finds most of its tokens computed by RAG's
prompt, and Self-Route's long-context call finds the document long context computed: measured
once, 679 of 733 prompt tokens cached, and Self-Route came out cheaper than RAG with more tokens.
A variant's cost must not depend on which other variants share the run.

The rule: the first record of each variant (its ``label``) that uses a prefix pays for it; later
records of the same variant reuse it as the backend did. ``PrefixLedger.charge`` sees each
completion with its request and variant, in the order the run handed them back, and says how
many of its cached prompt tokens the variant has not itself sent before (``PAID_KEY`` in the
completion's meta). ``Cost.of`` then charges those tokens as computed (``pay_prefix``):

* ``cached_prompt_tokens`` drops by them (the count charged), ``prefix_paid_tokens`` holds them;
* an api sheet prices them as the record that computed the prefix was priced: as uncached
  input, or, from a backend that reports the tokens it wrote to a provider's cache
  (``meta["cache_write_tokens"]``), as cache writes. (No backend here reports writes today, so a
  write premium is charged to neither: the variant alone and beside others pay alike.)
* the calibrated ``modelled_seconds`` model the prefix as computed (prefill included), and
  ``prefix_paid_seconds`` is what that adds; under the measured basis the charged seconds are
  the measured share plus ``prefix_paid_seconds``.

What stays measured: ``resource_seconds`` (its share of the device time that really passed),
``prefill_seconds``/latency, FLOPs and MFU (the work the device did). Only what is charged follows
this rule, so the charged seconds of a run's variants add up to more than its device time by the
prefixes they shared.

Which prefix: a completion says how many prompt tokens were cached, not whose. The ledger keeps,
per variant, hashes of every ``BLOCK``-character prefix of the text it has sent (system prompt and
prompt); a new prompt's longest such prefix the variant sent before, converted to tokens in
proportion to the prompt's characters, is what the variant already paid. A cached prefix within
``SLACK`` of that is fully paid (the proportion is an estimate: a declared document prefix is not
charged again for a few tokens of rounding). This works alike for every backend, servers
included, and for completions served from the completion cache (their stored counts are the
original run's, and the ledger judges them in this run's order).

Scope: one ledger per ``Resources``, i.e. per process that runs records. A resumed run starts a
new ledger (its first record of a variant on a prefix pays again, as a fresh process would
really compute it); so does each Ray worker (each computes its own prefixes).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from ragbench.cost.prices import modelled_seconds
from ragbench.llm.cost_model import Rates
from ragbench.types import Completion, GenerationRequest

BLOCK = 64  # characters: the grain at which the ledger compares prompts
SLACK = 0.05  # a cached prefix within this fraction (or two blocks) of what was paid: paid
PAID_KEY = "prefix_paid_tokens"  # in Completion.meta: cached tokens this variant pays for


def _text(request: GenerationRequest) -> str:
    return f"{request.system}\x00{request.prompt}"


def _block_hashes(text: str) -> list[bytes]:
    """Digests of text[:BLOCK], text[:2*BLOCK], ... (whole blocks only), incrementally."""
    h = hashlib.blake2b(digest_size=8)
    out = []
    for end in range(BLOCK, len(text) + 1, BLOCK):
        h.update(text[end - BLOCK : end].encode("utf-8", "surrogatepass"))
        out.append(h.copy().digest())
    return out


class PrefixLedger:
    """Per strategy variant, the prompt prefixes it has sent (see the module docstring)."""

    def __init__(self) -> None:
        self._sent: dict[str, set[bytes]] = {}

    def charge(
        self, variant: str, request: GenerationRequest, completion: Completion
    ) -> Completion:
        """``completion`` with ``meta[PAID_KEY]`` set to the cached prompt tokens ``variant`` has
        not paid for itself (unchanged when it has paid them all); records the request's text as
        sent by ``variant``."""
        text = _text(request)
        shared = self.sent(variant, request)
        cached = int(completion.cached_prompt_tokens or 0)
        if cached <= 0:
            return completion
        paid = own_tokens(shared, len(text), completion.prompt_tokens)
        unpaid = unpaid_tokens(cached, paid, completion.prompt_tokens, len(text))
        if unpaid <= 0:
            return completion
        return dataclasses.replace(completion, meta={**(completion.meta or {}), PAID_KEY: unpaid})

    def sent(self, variant: str, request: GenerationRequest) -> int:
        """Record ``request`` as sent (and paid) by ``variant``; returns how many leading
        characters of its text the variant had sent before (whole ``BLOCK``s). A call whose cost
        the variant carries some other way (a long-context preload, a one-time cost) is recorded
        with this alone."""
        hashes = _block_hashes(_text(request))
        seen = self._sent.setdefault(variant, set())
        shared_blocks = 0
        for digest in hashes:
            if digest not in seen:
                break
            shared_blocks += 1
        seen.update(hashes)
        return shared_blocks * BLOCK


def own_tokens(shared_chars: int, text_chars: int, prompt_tokens: int) -> int:
    """Prompt tokens in the first ``shared_chars`` of a text of ``text_chars``: in proportion."""
    if text_chars <= 0 or shared_chars <= 0:
        return 0
    return min(prompt_tokens, int(prompt_tokens * shared_chars / text_chars))


def unpaid_tokens(cached: int, paid: int, prompt_tokens: int, text_chars: int) -> int:
    """Cached tokens the variant still pays: none when what it paid is within the slack of them,
    else the difference."""
    per_block = prompt_tokens * BLOCK / text_chars if text_chars else 0
    if cached - paid <= max(SLACK * cached, 2 * per_block):
        return 0
    return cached - paid


def paid_tokens(completion: Completion) -> int:
    """Cached tokens the ledger charged ``completion``'s variant for (0 if none)."""
    return int((completion.meta or {}).get(PAID_KEY) or 0)


def pay_prefix(completion: Completion) -> Completion:
    """The completion as charged under the alone rule: its unpaid cached tokens computed.
    ``cached_prompt_tokens`` drops by them (so an api sheet prices them as input; as cache writes
    where the backend reports its writes), and the calibrated work (``meta["work"]``) computes them: with nothing of its prefix paid, the whole
    prefix is computed; with part paid, that part stays a reused prefix and the rest runs as
    prompt. Measured times are left as they are."""
    unpaid = paid_tokens(completion)
    if unpaid <= 0:
        return completion
    meta: dict[str, Any] = dict(completion.meta or {})
    if "cache_write_tokens" in meta:  # a backend that reports its cache writes: one more
        meta["cache_write_tokens"] = int(meta["cache_write_tokens"] or 0) + unpaid
    kept = completion.cached_prompt_tokens - unpaid
    work = meta.get("work")
    if isinstance(work, dict) and work.get("prefix_tokens"):
        if kept > 0:
            meta["work"] = {**work, "prefix_tokens": kept, "prefix_computed": False}
        else:
            meta["work"] = {**work, "prefix_computed": True}
    elif "alone_seconds_estimate" in meta and "work" not in meta:  # stored before meta["work"]
        meta["work"] = {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "prefix_tokens": completion.cached_prompt_tokens,
            "prefix_computed": kept <= 0,
        }
        if kept > 0:
            meta["work"]["prefix_tokens"] = kept
    return dataclasses.replace(completion, cached_prompt_tokens=kept, meta=meta)


def estimated_prefill_seconds(completion: Completion, tokens: int) -> float:
    """Seconds ``tokens`` more prompt tokens take at the completion's own measured prefill rate
    (for a backend without a calibrated model: servers, the fake)."""
    computed = completion.prompt_tokens - completion.cached_prompt_tokens
    if tokens <= 0 or computed <= 0:
        return 0.0
    return completion.prefill_seconds * tokens / computed


def charged_work(
    completion: Completion, rates: Rates | None
) -> tuple[Completion, float | None, float]:
    """(the completion as charged: ``pay_prefix``, its modelled seconds, the device seconds its
    paid prefix adds: by the calibrated model where there is one, else at its own prefill rate)."""
    paid, charged = paid_tokens(completion), pay_prefix(completion)
    modelled = modelled_seconds(charged, rates)
    if not paid:
        return charged, modelled, 0.0
    as_measured = modelled_seconds(completion, rates)
    if modelled is not None and as_measured is not None:
        return charged, modelled, modelled - as_measured
    return charged, modelled, estimated_prefill_seconds(completion, paid)
