"""Optional signatures (`pip install 'qwenquant[sign]'`): sigstore's model_signing, key method, offline.

The signature covers the manifest's files and qwenquant-manifest.json itself, and records the
companion files (card, reports, fetch record, the signature) as ignored paths, so that project's own
`model_signing verify key DIR --signature DIR/model.sig --public_key PUB` checks a fetched folder as is.
`verify_signature` runs model_signing's verification and then checks that the signed files are exactly
the manifest's, with the manifest's sha256 (a signature that skips a weight file is refused).
"""

from __future__ import annotations

import base64
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from qwenquant.errors import UsageError, VerificationError
from qwenquant.hashing import sha256_file
from qwenquant.manifest import (
    CARD_NAME,
    CARD_RECORD_NAME,
    MANIFEST_NAME,
    REPORTS_DIR,
    SIGNATURE_NAME,
    UNCHECKED_COMPANIONS,
    load_manifest,
)

log = logging.getLogger(__name__)

IGNORED = (*UNCHECKED_COMPANIONS, CARD_NAME, CARD_RECORD_NAME, REPORTS_DIR, ".qwenquant-staging", SIGNATURE_NAME)


def _model_signing() -> Any:
    try:
        import model_signing
        from model_signing import hashing, signing, verifying  # noqa: F401
    except ImportError as e:
        raise UsageError(f"signing needs sigstore's model_signing, which is not installed ({e})",
                         hint="pip install 'qwenquant[sign]'") from None
    return model_signing


def _hashing_config(ms: Any) -> Any:
    return ms.hashing.Config().set_ignored_paths(paths=list(IGNORED), ignore_git_paths=True)


def _readable(path: Path, what: str, flag: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{what} {path} not found", hint=f"pass an existing PEM file to {flag}")
    return path


def sign_artifact(artifact: Path, private_key: Path, signature: Path) -> Path:
    """Sign the manifest's files of `artifact` with an elliptic-curve private key (PEM); write `signature`."""
    ms = _model_signing()
    _readable(private_key, "private key", "--sign-key")
    try:
        cfg = ms.signing.Config().set_hashing_config(_hashing_config(ms)).use_elliptic_key_signer(private_key=private_key)
        cfg.sign(Path(artifact), signature)
    except (ValueError, TypeError) as e:
        raise UsageError(f"cannot sign with {private_key}: {e}".splitlines()[0],
                         hint="pass an unencrypted elliptic-curve private key in PEM (P-256/P-384/P-521)") from None
    return signature


def public_key_pem(private_key: Path) -> bytes:
    """The PEM public key of a PEM private key (to check a signature already on the Hub)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(private_key).read_bytes(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _signed_files(signature: Path) -> tuple[str, dict[str, str]]:
    """(hash type, signed file -> digest) from the bundle's in-toto statement (read after verification)."""
    bundle = json.loads(Path(signature).read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    pred = statement["predicate"]
    return pred["serialization"]["hash_type"], {r["name"]: r["digest"] for r in pred["resources"]}


def verify_signature(artifact: Path, signature: Path, public_key: Path | bytes) -> int:
    """Check `signature` over `artifact` with `public_key` (a PEM path or bytes); return the number of
    signed files. Raises VerificationError (one line) when it does not hold or signs other files."""
    ms = _model_signing()
    signature = _readable(signature, "signature", "--signature")
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(public_key, bytes):
            pub = Path(tmp) / "key.pub"
            pub.write_bytes(public_key)
        else:
            pub = _readable(public_key, "public key", "--public-key")
        from cryptography.exceptions import InvalidSignature

        try:
            ms.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(Path(artifact), signature)
        except (ValueError, KeyError, TypeError, OSError, InvalidSignature) as e:  # mismatch, wrong key, not a bundle
            raise VerificationError(f"signature {signature} does not hold for {artifact}: {e}".splitlines()[0][:400],
                                    hint="the files changed after signing, or the signature is for another key or "
                                         "artifact; never serve files that fail verification") from None
    hash_type, signed = _signed_files(signature)
    manifest = load_manifest(artifact)
    want = {f.path: f.sha256 for f in manifest.files} | {MANIFEST_NAME: sha256_file(Path(artifact) / MANIFEST_NAME)}
    if hash_type != "sha256" or signed != want:
        odd = sorted(set(signed) ^ set(want)) or sorted(p for p in want if signed.get(p) != want[p])
        raise VerificationError(f"signature {signature} is valid but does not sign exactly the manifest's files "
                                f"({', '.join(odd[:3]) or hash_type})",
                                hint="re-sign with `qwenquant publish --sign-key`, which signs the manifest's files")
    return len(signed)
