"""Loopback Hugging Face Hub server: local folders served as Hub repos to the real huggingface_hub client
(the demo's fetch step; benchmarks/fetch_bench.py). Downloads only: uploads, moving branches and fault
switches are the tests' (tests/support/hubserver).

    from qwenquant.testbed.hubserver import HubServer
    with HubServer() as hub:
        commit = hub.add_repo("Qwen/Qwen3.8-27B", folder, branch="main")
        # point huggingface_hub at hub.url (endpoint= / HF_ENDPOINT), HF_HUB_DISABLE_XET=1
        hub.requests  # every request: method, file, Range, status, bytes sent
"""

from qwenquant.testbed.hubserver.base import LoggedRequest
from qwenquant.testbed.hubserver.repos import HubFile, is_lfs_path
from qwenquant.testbed.hubserver.server import HubServer

__all__ = ["HubFile", "HubServer", "LoggedRequest", "is_lfs_path"]
