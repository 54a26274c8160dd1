"""``esreason info`` on GPU machines, tested on CPU with fake drivers: the driver and torch's CUDA
build it reports, whether they fit (MIN_LINUX_DRIVER) and "no GPU" when there is none."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch

from esreason import info


def fake_torch(*, cuda: str | None, available: bool, driver_api: int | None = None,
               names: tuple[str, ...] = ("NVIDIA H100 80GB HBM3",)) -> SimpleNamespace:
    """The parts of torch :func:`info.device_info` reads."""
    c = SimpleNamespace() if driver_api is None else SimpleNamespace(_cuda_getDriverVersion=lambda: driver_api)
    return SimpleNamespace(
        _C=c, version=SimpleNamespace(cuda=cuda), get_num_threads=lambda: 2,
        cuda=SimpleNamespace(is_available=lambda: available, device_count=lambda: len(names),
                             get_device_name=lambda i: names[i]))


def use_driver(monkeypatch, driver: str | None, driver_cuda: str | None = None, source: str = "nvidia-smi",
               gpus: tuple[str, ...] = ("NVIDIA H100 80GB HBM3",)) -> None:
    """Make NVML report nothing and nvidia-smi report ``driver`` (or no driver when None)."""
    monkeypatch.setattr(info, "_driver_from_nvml", lambda: None)
    found = None if driver is None else {"driver": driver, "driver_cuda": driver_cuda, "gpus": list(gpus),
                                         "source": source}
    monkeypatch.setattr(info, "_driver_from_nvidia_smi", lambda: found)


@pytest.mark.parametrize("torch_cuda, driver, driver_cuda, required, ok", [
    ("13.0", "580.65.06", None, 580, True),     # the [gpu] line's torch 2.13.0 on an R580 driver
    ("13.0", "575.57.08", None, 580, False),    # ... on an R575 driver (CUDA 12.9): too old
    ("12.8", "535.230.02", None, 525, True),    # a CUDA 12.8 torch under minor-version compatibility
    ("12.8", "470.256.02", None, 525, False),
    ("12.8", "590.44.01", None, 525, True),     # newer drivers run older CUDA (backward compatibility)
    ("13.0", None, "12.4", 580, False),         # no driver number: the driver's CUDA major decides
    ("13.0", None, "13.1", 580, True),
    ("14.0", "600.1", None, None, None),        # a CUDA major the table does not know
    ("13.0", None, None, 580, None),
    (None, "580.65.06", None, None, None),      # a CPU torch
])
def test_driver_compatibility_table(torch_cuda, driver, driver_cuda, required, ok):
    assert info.driver_compatibility(torch_cuda, driver, driver_cuda) == {"required_driver": required,
                                                                          "driver_ok": ok}


def test_minimum_drivers_are_nvidias_minor_version_compatibility_table():
    assert info.MIN_LINUX_DRIVER == {11: 450, 12: 525, 13: 580}


def test_cpu_machine_says_no_gpu(monkeypatch):
    use_driver(monkeypatch, None)
    dev = info.device_info(fake_torch(cuda=None, available=False))
    assert dev["type"] == "cpu" and dev["gpu"] is False
    text = info.format_info({**info.info_dict(), "device": dev})
    assert "no GPU: cpu (" in text and "driver " not in text


def test_cpu_machine_with_a_cuda_torch_build_says_no_gpu(monkeypatch):
    """A CUDA torch on a machine without a driver: the driver API reports 0."""
    use_driver(monkeypatch, None)
    dev = info.device_info(fake_torch(cuda="13.0", available=False, driver_api=0))
    assert dev["type"] == "cpu"


def test_this_machine_reports_its_device():
    text = info.info_text()
    if torch.cuda.is_available():
        assert "driver" in text and f"CUDA {torch.version.cuda}" in text
    else:
        assert "no GPU" in text or "driver" in text   # a driver without a usable CUDA device is reported too


def test_compatible_driver(monkeypatch):
    use_driver(monkeypatch, "580.95.05")
    dev = info.device_info(fake_torch(cuda="13.0", available=True))
    assert dev == {"type": "cuda", "gpu": True, "cuda": "13.0", "torch_cuda_available": True,
                   "devices": ["NVIDIA H100 80GB HBM3"], "driver": "580.95.05", "driver_cuda": None,
                   "driver_source": "nvidia-smi", "required_driver": 580, "driver_ok": True}
    text = info.format_info({**info.info_dict(), "device": dev})
    assert "device        cuda 13.0: [0] NVIDIA H100 80GB HBM3" in text
    assert "driver        580.95.05 [nvidia-smi]; torch built for CUDA 13.0 needs driver >= 580: ok" in text
    json.dumps(dev)


def test_driver_too_old_for_a_cuda13_torch(monkeypatch):
    """torch then sees no device at all; info still names the GPU, the driver and the fix."""
    use_driver(monkeypatch, "550.163.01", driver_cuda="12.4", source="nvml", gpus=("NVIDIA A100-SXM4-80GB",))
    dev = info.device_info(fake_torch(cuda="13.0", available=False))
    assert dev["type"] == "cuda" and dev["driver_ok"] is False and dev["torch_cuda_available"] is False
    assert dev["devices"] == ["NVIDIA A100-SXM4-80GB"]
    line = info._driver_line(dev)
    assert line.startswith("550.163.01 (CUDA 12.4) [nvml]; torch built for CUDA 13.0 needs driver >= 580: "
                           "driver too old: upgrade it, or see docs/install.md")
    assert "older drivers" in line and line.endswith("(torch sees no CUDA device)")


def test_cpu_torch_on_a_gpu_machine(monkeypatch):
    use_driver(monkeypatch, "570.133.20")
    dev = info.device_info(fake_torch(cuda=None, available=False))
    assert dev["type"] == "cuda" and dev["driver_ok"] is None
    assert "torch is a CPU build" in info._driver_line(dev)
    assert "cuda (CPU torch): [0] NVIDIA H100" in info.format_info({**info.info_dict(), "device": dev})


def test_torch_driver_api_fallback(monkeypatch):
    """Neither NVML nor nvidia-smi: torch's driver API version (13000 = CUDA 13.0) decides."""
    use_driver(monkeypatch, None)
    dev = info.device_info(fake_torch(cuda="13.0", available=True, driver_api=13000))
    assert dev["driver"] is None and dev["driver_cuda"] == "13.0" and dev["driver_source"] == "torch"
    assert dev["driver_ok"] is True
    assert info._driver_line(dev).startswith("supports CUDA 13.0 [torch]; torch built for CUDA 13.0")
    dev = info.device_info(fake_torch(cuda="13.0", available=False, driver_api=12080))
    assert dev["driver_cuda"] == "12.8" and dev["driver_ok"] is False


def test_nvidia_smi_output_is_parsed(monkeypatch):
    calls = []

    def run(cmd, **kw):
        calls.append((cmd, kw))
        return subprocess.CompletedProcess(cmd, 0, stdout="575.57.08, NVIDIA H100 80GB HBM3\n"
                                                          "575.57.08, NVIDIA H100 80GB HBM3\n", stderr="")

    monkeypatch.setattr(info.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(info.subprocess, "run", run)
    assert info._driver_from_nvidia_smi() == {"driver": "575.57.08", "driver_cuda": None, "source": "nvidia-smi",
                                              "gpus": ["NVIDIA H100 80GB HBM3"] * 2}
    assert calls[0][0][1:] == ["--query-gpu=driver_version,name", "--format=csv,noheader"]
    assert calls[0][1]["timeout"] == info.NVIDIA_SMI_TIMEOUT_S


@pytest.mark.parametrize("outcome", ["timeout", "oserror", "failed", "empty"])
def test_nvidia_smi_failures_mean_no_driver(monkeypatch, outcome):
    def run(cmd, **kw):
        if outcome == "timeout":
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        if outcome == "oserror":
            raise PermissionError(cmd[0])
        return subprocess.CompletedProcess(cmd, 9 if outcome == "failed" else 0,
                                           stdout="" if outcome == "empty" else "NVIDIA-SMI has failed", stderr="")

    monkeypatch.setattr(info.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(info.subprocess, "run", run)
    assert info._driver_from_nvidia_smi() is None


def test_no_nvidia_smi_means_no_driver(monkeypatch):
    monkeypatch.setattr(info.shutil, "which", lambda name: None)
    assert info._driver_from_nvidia_smi() is None


def test_nvml_is_read_when_pynvml_is_installed(monkeypatch):
    class NVMLError(Exception):
        pass

    fake = SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"535.247.01", nvmlSystemGetCudaDriverVersion=lambda: 12020,
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    assert info._driver_from_nvml() == {"driver": "535.247.01", "driver_cuda": "12.2",
                                        "gpus": ["NVIDIA A100-SXM4-40GB"], "source": "nvml"}

    def fail() -> None:
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setattr(fake, "nvmlInit", fail)
    assert info._driver_from_nvml() is None


def test_install_doc_states_the_drivers_info_checks():
    """docs/install.md's GPU install names the default line's driver floor (CUDA 13), what older
    drivers (CUDA 12) can do, and the CUDA 12 pair's line, with NVIDIA's table as the source."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    install = (repo / "docs" / "install.md").read_text()
    assert "pip install -e '.[gpu]'" in install
    assert f"driver >= {info.MIN_LINUX_DRIVER[13]}" in install
    assert f"Older drivers ({info.MIN_LINUX_DRIVER[12]}-{info.MIN_LINUX_DRIVER[13] - 1}, CUDA 12)" in install
    assert "vLLM 0.19.1 with torch 2.10.0" in install and "cuda-compat-13-0" in install
    assert "pip install -e '.[ray]' 'trl>=1.16' 'vllm==0.19.1' 'torch==2.10.0'" in install
    assert "minor-version-compatibility.html" in install
    # The wheel table (package | pins | built for | Linux driver): every row's driver is esreason info's minimum.
    import re

    rows = [[c.strip() for c in line.strip("|").split("|")] for line in install.splitlines()
            if line.startswith("| ") and re.search(r"\| CUDA \d+", line)]
    assert len(rows) >= 7, rows
    for row in rows:
        major = int(re.match(r"CUDA (\d+)", row[2]).group(1))
        assert row[3] == f">= {info.MIN_LINUX_DRIVER[major]}", row
