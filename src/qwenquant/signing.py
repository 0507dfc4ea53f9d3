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
from dataclasses import dataclass
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

IGNORED = (*UNCHECKED_COMPANIONS, ".qwenquant-staging", SIGNATURE_NAME)


@dataclass(frozen=True)
class Signed:
    """What a signature that holds covers: how many files, and whether the card files are among them."""

    files: int
    manifest_files: int
    card_files: tuple[str, ...]

    def covers(self) -> str:
        if not self.card_files:
            return (
                f"the manifest's {self.manifest_files} files and the manifest; not the card or the reports "
                "(signed before qwenquant signed them)"
            )
        reports = len(self.card_files) - 2
        return (
            f"the manifest's {self.manifest_files} files, the manifest, the card, its record and "
            f"{reports} report{'s' if reports != 1 else ''}"
        )


def _model_signing() -> Any:
    try:
        import model_signing
        from model_signing import hashing, signing, verifying  # noqa: F401
    except ImportError as e:
        raise UsageError(
            f"signing needs sigstore's model_signing, which is not installed ({e})",
            hint="pip install 'qwenquant[sign]'",
        ) from None
    return model_signing


def _hashing_config(ms: Any) -> Any:
    # symlinks: the published view links the artifact's files (published_view)
    return ms.hashing.Config().set_ignored_paths(paths=list(IGNORED), ignore_git_paths=True).set_allow_symlinks(True)


def published_view(artifact: Path, generated: dict[str, bytes], folder: Path) -> Path:
    """`folder` laid out as the published repo: links to the manifest's files and the manifest, and the
    generated card files written out (what `sign_artifact` signs and a downloader verifies)."""
    manifest = load_manifest(artifact)
    for rel in [f.path for f in manifest.files] + [MANIFEST_NAME]:
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to((Path(artifact) / rel).resolve())
    for rel, data in generated.items():
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
    return folder


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
        cfg = (
            ms.signing.Config().set_hashing_config(_hashing_config(ms)).use_elliptic_key_signer(private_key=private_key)
        )
        cfg.sign(Path(artifact), signature)
    except (ValueError, TypeError) as e:
        raise UsageError(
            f"cannot sign with {private_key}: {e}".splitlines()[0],
            hint="pass an unencrypted elliptic-curve private key in PEM (P-256/P-384/P-521)",
        ) from None
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


def _card_files(artifact: Path) -> dict[str, str]:
    """The card files of a published folder -> sha256 (none without a card record)."""
    artifact = Path(artifact)
    if not (artifact / CARD_RECORD_NAME).is_file():
        return {}
    names = [CARD_NAME, CARD_RECORD_NAME] + sorted(
        p.relative_to(artifact).as_posix() for p in (artifact / REPORTS_DIR).rglob("*") if p.is_file()
    )
    return {n: sha256_file(artifact / n) for n in names if (artifact / n).is_file()}


def _bundle(signature: Path) -> None:
    """A UsageError unless `signature` is a sigstore bundle as model_signing writes it (JSON with a DSSE
    envelope): a key or another file passed to --signature is a mistake, not a signature that fails."""
    try:
        bundle = json.loads(Path(signature).read_bytes())
    except (ValueError, UnicodeDecodeError):
        bundle = None
    if not (
        isinstance(bundle, dict)
        and str(bundle.get("mediaType", "")).startswith("application/vnd.dev.sigstore.bundle")
        and isinstance(bundle.get("dsseEnvelope"), dict)
    ):
        raise UsageError(
            f"{signature} is not a model_signing signature (a sigstore bundle: JSON with a mediaType "
            "and a dsseEnvelope)",
            hint="pass the model.sig that `qwenquant publish --sign-key` wrote beside the artifact",
        )


def _public_key(path: Path) -> None:
    """A key model_signing's key method takes: an elliptic-curve public key in PEM (UsageError otherwise)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = Path(path).read_bytes()
    if b"PRIVATE KEY" in data:
        raise UsageError(
            f"{path} is a private key, not the public key",
            hint="pass the publisher's public key (PEM); never hand out a private key",
        )
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as e:
        raise UsageError(
            f"{path} is not a PEM public key ({e})".splitlines()[0],
            hint="pass the publisher's elliptic-curve public key (PEM, BEGIN PUBLIC KEY)",
        ) from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        kind = type(key).__name__.removesuffix("PublicKey").lstrip("_")
        raise UsageError(
            f"{path} is {'an' if kind[:1] in 'AEIOR' else 'a'} {kind} public key; "
            "model_signing's key method takes elliptic-curve keys only",
            hint="ask the publisher for the P-256/P-384/P-521 public key the artifact was signed with",
        )


def verify_signature(artifact: Path, signature: Path, public_key: Path | bytes, *, view: bool = False) -> Signed:
    """Check `signature` over `artifact` with `public_key` (a PEM path or bytes); return what it covers.
    Raises VerificationError (one line) when it does not hold or signs other files; UsageError for a key
    of a kind the key method does not take. `view`: `artifact` is a `published_view` (links followed)."""
    ms = _model_signing()
    if not Path(signature).is_file() and Path(signature).parent.resolve() == Path(artifact).resolve():
        raise VerificationError(
            f"{artifact} holds no signature {Path(signature).name}: the signature that is required is missing",
            hint="it was removed or never published: ask the publisher "
            "for the signed revision; never serve it unsigned (--signature FILE if it lies elsewhere)",
        )
    signature = _readable(signature, "signature", "--signature")
    _bundle(signature)
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(public_key, bytes):
            pub = Path(tmp) / "key.pub"
            pub.write_bytes(public_key)
        else:
            pub = _readable(public_key, "public key", "--public-key")
        _public_key(pub)
        from cryptography.exceptions import InvalidSignature

        try:
            cfg = ms.verifying.Config().use_elliptic_key_verifier(public_key=pub)
            if view:
                cfg.set_hashing_config(_hashing_config(ms))
            cfg.verify(Path(artifact), signature)
        except (ValueError, KeyError, TypeError, OSError, InvalidSignature) as e:  # mismatch, wrong key, not a bundle
            raise VerificationError(
                f"signature {signature} does not hold for {artifact}: {e}".splitlines()[0][:400].rstrip(),
                hint="the files changed after signing, or the signature is for another key or "
                "artifact; never serve files that fail verification",
            ) from None
    hash_type, signed = _signed_files(signature)
    manifest = load_manifest(artifact)
    want = {f.path: f.sha256 for f in manifest.files} | {MANIFEST_NAME: sha256_file(Path(artifact) / MANIFEST_NAME)}
    card = _card_files(artifact)
    ok = hash_type == "sha256" and signed in (want, want | card)
    if not ok:
        odd = sorted(set(signed) ^ set(want | card)) or sorted(p for p in want if signed.get(p) != want[p])
        raise VerificationError(
            f"signature {signature} is valid but does not sign exactly the manifest's files "
            f"and the card's ({', '.join(odd[:3]) or hash_type})",
            hint="re-sign with `qwenquant publish --sign-key`, which signs the manifest's files and the card files",
        )
    return Signed(len(signed), len(manifest.files), tuple(sorted(card)) if signed == want | card and card else ())
