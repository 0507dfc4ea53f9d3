"""The split a multi-GPU server gets from the GPUs' link: `nvidia-smi topo -m` and
`nvidia-smi topo -p2p r` parsed from text in the layout those commands print (tests/helpers.py:
tab-separated matrices, a legend after them; NIC rows and columns on servers with network cards),
and the rule NVLink or peer-to-peer PCIe -> tensor, PCIe without peer-to-peer -> pipeline.
"""

from __future__ import annotations

import pytest

from qwenquant.serve.topology import Layout, choose_split, parse_matrix

from helpers import NV4_2, P2P_CNS, P2P_OK, P2P_SERVER, PHB_2, SERVER_4


def test_parse_two_gpus():
    assert parse_matrix(PHB_2) == {("0", "0"): "X", ("0", "1"): "PHB", ("1", "0"): "PHB", ("1", "1"): "X"}
    assert parse_matrix(P2P_CNS)["0", "1"] == "CNS"


def test_parse_leaves_out_nics_and_reads_colour():
    m = parse_matrix(SERVER_4)
    assert len(m) == 16 and ("0", "1") in m and not any("NIC" in a or "NIC" in b for a, b in m)
    assert (m["0", "1"], m["0", "2"], m["2", "3"]) == ("PIX", "SYS", "PXB")
    coloured = PHB_2.replace("PHB\t0-23", "\x1b[1;32mPHB\x1b[0m\t0-23")
    assert parse_matrix(coloured) == parse_matrix(PHB_2)


@pytest.mark.parametrize(
    "text",
    ["", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "No devices were found"],
)
def test_unreadable_output_is_empty(text):
    assert parse_matrix(text) == {}


def test_pcie_without_p2p_is_pipeline():
    s = choose_split(["0", "1"], parse_matrix(PHB_2), parse_matrix(P2P_CNS))
    assert (s.tp, s.pp, s.kind) == (1, 2, "pipeline")
    assert s.line() == (
        "split over 2 GPUs: pipeline parallelism (GPU 0 and GPU 1 are linked by PCIe (PHB) without "
        "peer-to-peer (peer-to-peer read CNS): tensor parallelism's all-reduce would cross host "
        "memory every layer)"
    )
    # the link read, the peer-to-peer matrix not: no proof of peer-to-peer, so pipeline
    assert choose_split(["0", "1"], parse_matrix(PHB_2), {}).kind == "pipeline"


def test_pcie_with_p2p_and_nvlink_are_tensor():
    s = choose_split(["0", "1"], parse_matrix(PHB_2), parse_matrix(P2P_OK))
    assert (s.tp, s.pp) == (2, 1)
    assert s.reason == "PCIe (PHB) with peer-to-peer reads between the GPUs"
    s = choose_split(["0", "1"], parse_matrix(NV4_2), {})
    assert (s.tp, s.pp) == (2, 1) and s.reason == "NVLink between every pair of GPUs (NV4)"


def test_the_gpus_used_decide():
    """CUDA_VISIBLE_DEVICES=2,3 on the server: the pair behind one switch, peer-to-peer OK; 1,2 cross sockets."""
    links, p2p = parse_matrix(SERVER_4), parse_matrix(P2P_SERVER)
    assert choose_split(["2", "3"], links, p2p).kind == "tensor"
    s = choose_split(["1", "2"], links, p2p)
    assert s.kind == "pipeline" and "GPU 1 and GPU 2 are linked by PCIe (SYS)" in s.reason
    assert choose_split(["0", "1", "2", "3"], links, p2p).pp == 4


def test_unknown_link_keeps_tensor_and_says_so():
    s = choose_split(["0", "1"], {}, {})
    assert s == Layout(2, 1, "the GPUs' link could not be read from `nvidia-smi topo -m`; pass --split to choose")


def test_decide_layout_keeps_tensor_for_mtp_where_the_link_would_pick_pipeline():
    """One function for serve and plan: -- flags, then --split, then the link; a drafting profile stays on tensor
    where the link alone would pick pipeline, and says both reasons."""
    from qwenquant.serve.topology import MTP_TENSOR, decide_layout

    pcie = (["0", "1"], parse_matrix(PHB_2), parse_matrix(P2P_CNS))
    nvlink = (["0", "1"], parse_matrix(NV4_2), {})
    assert decide_layout(2, None, "cuda", None, None, False, pcie).pp == 2
    mtp = decide_layout(2, None, "cuda", None, None, True, pcie)
    assert (mtp.tp, mtp.pp) == (2, 1) and mtp.reason.startswith(MTP_TENSOR + "; the link alone would pick pipeline")
    assert decide_layout(2, None, "cuda", None, None, True, nvlink).reason.startswith("NVLink between every pair")
    assert decide_layout(2, "pipeline", "cuda", None, None, True, pcie) == Layout(1, 2, "--split pipeline")
    assert decide_layout(2, "tensor", "cuda", None, 2, True, pcie) == Layout(1, 2, "the vLLM flags after --")
    assert decide_layout(1, None, "cuda", None, None, True, pcie) == Layout(1, 1, "one GPU")
    assert decide_layout(2, None, "cpu", None, None, False, None).reason == "cpu: no GPU link to read"
