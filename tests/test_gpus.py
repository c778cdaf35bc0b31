"""GPU registry lookups and detection (NVML absent here; nvidia-smi through a stand-in executable)."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from ocrserve.gpu import registry as gpus
from ocrserve.gpu.registry import GpuError, detect, lookup, match_detected, parse_nvidia_smi


@pytest.mark.parametrize("name", ["RTX 4090D", "rtx-4090d", "rtx 4090 d", "NVIDIA GeForce RTX 4090 D", "4090D"])
def test_lookup_tolerates_case_spaces_and_vendor_words(name):
    assert lookup(name).name == "RTX 4090D"


def test_lookup_keeps_4090_and_4090d_apart():
    assert lookup("RTX 4090").name == "RTX 4090"
    assert lookup("geforce rtx 4090").name == "RTX 4090"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a100-80g", "A100 80G"),
        ("A100 40G", "A100 40G"),
        ("H200", "H200 141G"),
        ("h100", "H100 80G"),
        ("T4", "T4 16G"),
        ("L40S", "L40S 48G"),
        ("L4", "L4"),
        ("A10", "A10 24G"),
        ("rtx3060", "RTX 3060 12G"),
        ("RTX 2080 Ti", "RTX 2080 Ti"),
        ("RTX 3090", "RTX 3090"),
    ],
)
def test_lookup_every_registry_card(name, expected):
    assert lookup(name).name == expected


def test_unknown_gpu_names_the_known_ones():
    with pytest.raises(GpuError) as err:
        lookup("Voodoo 5")
    assert "RTX 4090D" in str(err.value) and "--gpu-memory" in str(err.value)


def test_memory_and_bf16():
    card = lookup("RTX 4090D")
    assert card.memory_mib == int(23.64 * 1024) < 24 * 1024  # CUDA's total, below the nominal 24 GiB
    assert card.bf16 and card.bandwidth_bytes_per_s == 1008e9
    assert not lookup("T4").bf16 and not lookup("RTX 2080 Ti").bf16  # Turing: compute capability 7.5
    assert lookup("A100 80G").bf16 and lookup("H200").bf16
    assert lookup("H200").memory_mib == 143156  # torch's total_memory on an H200 (nvidia-smi: 143771)


def test_every_entry_cites_a_source():
    for card in gpus.GPUS:
        assert card.source.startswith("https://"), card.name


def test_parse_nvidia_smi():
    out = "NVIDIA H200, 143771\nNVIDIA H200, 143771\n"
    assert parse_nvidia_smi(out) == [("NVIDIA H200", 143771), ("NVIDIA H200", 143771)]
    assert parse_nvidia_smi("") == []


@pytest.mark.parametrize(
    "reported, mib, expected",
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "A100 80G"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100 40G"),
        ("NVIDIA GeForce RTX 4090 D", 24564, "RTX 4090D"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX 4090"),
        ("Tesla T4", 15360, "T4 16G"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100 80G"),
        ("NVIDIA L40S", 46068, "L40S 48G"),
        ("NVIDIA L4", 23034, "L4"),
        ("NVIDIA H200", 143771, "H200 141G"),
    ],
)
def test_match_detected_names(reported, mib, expected):
    assert match_detected(reported, mib).name == expected


def test_match_detected_unknown_card():
    assert match_detected("NVIDIA B200", 183359) is None


def _fake_nvidia_smi(tmp_path, output: str):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path)


def test_detect_falls_back_to_nvidia_smi(tmp_path, monkeypatch):
    if shutil.which("nvidia-smi"):
        pytest.skip("a real nvidia-smi is on PATH")
    monkeypatch.setenv(
        "PATH",
        _fake_nvidia_smi(tmp_path, "NVIDIA H200, 143771\\nNVIDIA H200, 143771\\n") + os.pathsep + os.environ["PATH"],
    )
    found = detect()
    assert (found.name, found.memory_mib, found.count, found.via) == ("NVIDIA H200", 143771, 2, "nvidia-smi")
    spec = found.as_spec()  # nvidia-smi's total is above CUDA's: the registry's CUDA total is planned with
    assert spec.name == "H200 141G" and spec.memory_mib == 143156 and spec.bf16


def test_detect_unknown_card_keeps_its_memory(tmp_path, monkeypatch):
    if shutil.which("nvidia-smi"):
        pytest.skip("a real nvidia-smi is on PATH")
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, "NVIDIA B200, 183359\\n") + os.pathsep + os.environ["PATH"])
    spec = detect().as_spec()
    assert spec.memory_mib == 183359 and spec.bandwidth_gbs == 0 and "not in the registry" in spec.source


def test_detect_without_gpu_says_what_to_do(monkeypatch, tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    with pytest.raises(GpuError) as err:
        detect()
    assert "no NVIDIA GPU found" in str(err.value) and "--gpu NAME" in str(err.value)
