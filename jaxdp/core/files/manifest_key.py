"""A keyed MAC on a checkpoint's manifest, under a key the user gives (`JAXDP_CHECKPOINT_KEY`), in both
frameworks: the manifest alone proves integrity (a checksum anyone can recompute); with the key it also
proves that the manifest was written by a run that held the key, so a file changed and a manifest
recomputed without the key is refused on `--resume`.

- Saving with the key set: the manifest carries `"mac"`, HMAC-SHA256 under the key of the rest of the
  manifest (canonical JSON: sorted keys), which names every file's SHA-256, the framework and the step.
- `--resume` with the key set: a manifest without a MAC, with a MAC under another key, or written for
  another step (a step folder copied under a new number) makes the step damaged (exit 3).
- `--resume` without the key: the MAC is not checked (integrity only), as before.

It does not prove freshness: an older step of any run under the same key, left at its own step number,
passes. The key is read from the environment (every process and rank inherits it) and never written.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os

ENV = "JAXDP_CHECKPOINT_KEY"
FIELD = "mac"


def key() -> bytes | None:
    """The user's key, or None when `JAXDP_CHECKPOINT_KEY` is unset or empty."""
    given = os.environ.get(ENV, "")
    return given.encode() if given else None


def _mac(secret: bytes, body: dict) -> str:
    text = json.dumps({k: v for k, v in body.items() if k != FIELD}, sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def sign(body: dict) -> dict:
    """`body` with its MAC when the key is set; as it is otherwise."""
    secret = key()
    return {**body, FIELD: _mac(secret, body)} if secret else body


def problem(body: dict, step_name: str) -> str | None:
    """None when the key is unset, or when `body` carries a MAC under the key for step `step_name`."""
    secret = key()
    if secret is None:
        return None
    given = body.get(FIELD)
    if not isinstance(given, str):
        return (f"its manifest carries no MAC and {ENV} is set (saved without the key, or rewritten by "
                f"someone without it)")
    if not hmac.compare_digest(given, _mac(secret, body)):
        return f"its manifest's MAC does not match {ENV} (another key, or the manifest was rewritten)"
    if str(body.get("step")) != step_name:
        return f"its manifest was written for step {body.get('step')!r} (a step folder copied under another number)"
    return None
