"""GPU discovery: NVML (pynvml) on a real node, or a declared fake inventory (`--fake`)."""

from __future__ import annotations

import uuid

from apps.platform.agent_protocol import GpuInfo


class NoGpuError(RuntimeError):
    """NVML is missing, the driver does not answer, or it reports no GPU."""


def fake_gpus(node: str, count: int, memory_mib: int = 81920) -> list[GpuInfo]:
    return [
        GpuInfo(
            index=i,
            uuid=f"GPU-fake-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{i}')}",
            memory_mib=memory_mib,
        )
        for i in range(count)
    ]


class Nvml:
    """A thin wrapper that keeps NVML initialised for the agent's lifetime."""

    def __init__(self):
        try:
            import pynvml
        except ImportError as error:
            raise NoGpuError(f"pynvml is not installed: {error}") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NoGpuError(
                f"NVML could not start ({error}). Is the NVIDIA driver installed and loaded "
                "(does `nvidia-smi` work)? Use --fake to run without GPUs."
            ) from None
        self.count = pynvml.nvmlDeviceGetCount()
        if self.count == 0:
            raise NoGpuError("NVML reports no GPU on this machine. Use --fake to run without GPUs.")

    def model(self) -> str:
        name = self.nv.nvmlDeviceGetName(self.nv.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name

    def gpus(self, limit: int | None = None) -> list[GpuInfo]:
        infos = []
        for index in range(self.count if limit is None else min(limit, self.count)):
            infos.append(self._info(index))
        return infos

    def _info(self, index: int) -> GpuInfo:
        nv = self.nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            gpu_uuid = nv.nvmlDeviceGetUUID(handle)
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            utilization = nv.nvmlDeviceGetUtilizationRates(handle)
            return GpuInfo(
                index=index,
                uuid=gpu_uuid.decode() if isinstance(gpu_uuid, bytes) else gpu_uuid,
                memory_mib=memory.total // (1024 * 1024),
                healthy=True,
                utilization_percent=int(utilization.gpu),
                memory_used_mib=memory.used // (1024 * 1024),
            )
        except nv.NVMLError:
            # A GPU that stops answering NVML is unhealthy: the dispatcher stops placing on it.
            return GpuInfo(index=index, uuid=f"GPU-unknown-{index}", healthy=False)
