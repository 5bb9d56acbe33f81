"""musacoder: train and evaluate LLMs that write native GPU kernels (MusaCoder method, MooreEval verifier)."""

from musacoder.api import Verifier, get_verifier, verify, verify_many  # noqa: E402
from musacoder.config import VerifyConfig  # noqa: E402
from musacoder.verifier.verdict import Status, Verdict  # noqa: E402
from musacoder.version import __version__  # noqa: E402

__all__ = ["VerifyConfig", "Status", "Verdict", "Verifier", "get_verifier", "verify", "verify_many", "__version__"]
