"""cuda-probe: run a tiny computation on the GPUs the job was given, if a CUDA stack is present.
Used once on a real GPU machine to prove the agent's NVML discovery and CUDA_VISIBLE_DEVICES."""

import json
import os
import sys

from gpuplatform_job import output_dir, report_progress


def main() -> int:
    result: dict[str, object] = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import torch  # noqa: PLC0415 (optional, only on GPU machines)

        result["torch_cuda_available"] = torch.cuda.is_available()
        result["device_count"] = torch.cuda.device_count()
        if torch.cuda.is_available():
            x = torch.ones(1024, 1024, device="cuda")
            result["matmul_sum"] = float((x @ x).sum().item())
            result["device_name"] = torch.cuda.get_device_name(0)
    except ImportError:
        result["torch"] = "not installed"
    (output_dir() / "cuda.json").write_text(json.dumps(result, indent=2))
    report_progress(1.0)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
