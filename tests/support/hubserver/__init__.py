"""The tests' loopback Hugging Face Hub: the demo's download hub (qwenquant.testbed.hubserver) plus uploads
(uploads.py, store.py), branches moved mid-run, history rewrites and fault switches (faults.py).

    from support.hubserver import Fault, HubServer
    with HubServer() as hub:
        commit = hub.add_repo("Qwen/Qwen3.8-27B", folder, branch="main")
        hub.faults.add(Fault("truncate", path="model-00001-of-00002.safetensors", times=1))
        # point huggingface_hub at hub.url (endpoint= / HF_ENDPOINT), HF_HUB_DISABLE_XET=1
        hub.move_branch("Qwen/Qwen3.8-27B", "main", other_commit, after_requests=3)
        hub.requests  # every request: method, file, Range, status, bytes sent, faults fired
"""

from qwenquant.testbed.hubserver.base import LoggedRequest
from qwenquant.testbed.hubserver.repos import HubFile, is_lfs_path

from support.hubserver.faults import KINDS as FAULT_KINDS
from support.hubserver.faults import Fault, FaultSet
from support.hubserver.server import HubServer

__all__ = ["FAULT_KINDS", "Fault", "FaultSet", "HubFile", "HubServer", "LoggedRequest", "is_lfs_path"]
