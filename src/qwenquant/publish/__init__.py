"""Publish an artifact to the Hub with a model card that carries its measured figures, and check signatures.

    publish_artifact(artifact, repo_id, revision="main") -> PublishResult   (verify, card, one commit or none)
    build_card(...) -> Card                                                (pure: README.md and its sealed record)
    verify_signature(artifact, signature, public_key)                      (VerificationError when it does not hold)

Modules: reports (which reports may feed the card), figures (values read by JSON path), card, cardcheck
(the card re-derived from the manifest and the reports, for verify and fetch), plan (the commit against
the revision's listing), hub (huggingface_hub calls), signing (model_signing), run.
"""

from qwenquant.signing import sign_artifact, verify_signature

__all__ = ["sign_artifact", "verify_signature"]
