"""One digest of values, bit for bit: tensors by dtype, shape and bytes (a DTensor by this rank's shard), numpy arrays
likewise, containers in order, anything else by its repr. The resume check's capture, the wrapped modules' records
and the toy models' replica digests all take it."""

from __future__ import annotations

import hashlib

import torch
import xxhash

#: the digest the capture takes of every step's parameters, state and batches: XXH3-128, 10x SHA-256's speed here
#: (14.4 GB/s against 1.5 GB/s): SHA-256 of a 2M-parameter model's weights cost about what its SGD step did. 128 bits:
#: two different values that no one built to collide meet with a chance of about 2**-128.
Digest = xxhash.xxh3_128

#: the digest a report shows (a wrapped module's ``digest``: SHA-256, as docs/report-schema.md says)
SHA256 = hashlib.sha256


def hexdigest(value, algorithm=Digest) -> str:
    """The hex digest (``algorithm``: :data:`Digest` or :data:`SHA256`) of ``value``, bit for bit (:func:`feed`)."""
    digest = algorithm()
    feed(digest, value)
    return digest.hexdigest()


def local(value):
    """A DTensor's local shard (FSDP2: what this rank holds); any other value as it is."""
    return value.to_local() if hasattr(value, "to_local") else value


def feed(digest, value) -> None:
    """Update ``digest`` with ``value``: tensors by dtype, shape and bytes; containers in order; else its repr."""
    if isinstance(value, torch.Tensor):
        tensor = local(value).detach()
        tensor = tensor if tensor.device.type == "cpu" and tensor.is_contiguous() else tensor.cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            try:
                digest.update(tensor.numpy())  # contiguous: its bytes as they are
            except (TypeError, RuntimeError):  # a dtype numpy has not (bfloat16), a conjugate view: its bytes
                digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a numpy array (numpy's RNG state holds one)
        digest.update(f"A{value.dtype}{getattr(value, 'shape', ())}".encode())
        digest.update(value.tobytes())
    elif isinstance(value, dict):
        digest.update(b"{")
        for key in value:
            digest.update(repr(key).encode())
            feed(digest, value[key])
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            feed(digest, item)
        digest.update(b"]")
    else:
        text = repr(value)
        digest.update((type(value).__qualname__ if " at 0x" in text else text).encode())  # no memory address
