"""Worker startup logs in SGLang's own line formats, for the gates attacks.

The formats (logging prefix, scheduler line, KV allocation line, ``server_args=`` and
``install_canary:``) are the ones kvprobe's serverlog module documents for SGLang
0.5.13-0.5.23; tests/unit/gates/test_gates_deployments.py renders the per-release variants from
the wheels' format strings.
"""

from __future__ import annotations

CONTEXT = 1_048_576  # GLM context length in the incident
INCIDENT = 681_280  # the pool a worker allocated in the incident
RAISED = 2_040_000  # a pool that covers the context


def args_dict(mode: str, **extra) -> dict:
    """The server-argument fields the gates read, as engine.py logs them (resolved dict)."""
    fields = {
        "model_path": "zai-org/GLM-5.3",
        "device": "cuda",
        "tp_size": 8,
        "dp_size": 1,
        "context_length": None,
        "kv_canary": "none",
        "disaggregation_transfer_backend": "mooncake",
        "disaggregation_mode": mode,
        "disaggregation_enable_kv_checksum": False,
    }
    fields.update(extra)
    return fields


def startup_log(
    mode: str,
    pool: int,
    context: int = CONTEXT,
    *,
    args: dict | str | None = None,
    kv_tokens: tuple[int, ...] | None = None,
    canary: bool = False,
    role_in_log: bool = True,
    after: tuple[str, ...] = (),
    swa: int | None = None,
) -> str:
    """One worker's startup log: server_args (unless ``role_in_log`` is False), one KV
    allocation line per ``kv_tokens`` (default: the pool), the canary line, the scheduler
    line, "ready", then ``after`` (lines logged while serving). ``swa``: a hybrid
    sliding-window model as 0.5.13 logs it, its unlabelled SWA pool of ``swa`` tokens first."""
    count = [0]

    def line(text: str, ranks: str = " TP0") -> str:
        count[0] += 1
        return f"[2026-08-27 10:00:{count[0] % 60:02d}{ranks}] {text}"

    lines = []
    if role_in_log:
        shown = args if isinstance(args, str) else repr(args or args_dict(mode))
        lines.append(line("server_args=" + shown, ranks=""))
    if swa is not None:
        lines.append(line(f"Use sliding window memory pool. full_layer_tokens={pool}, swa_layer_tokens={swa}"))
        lines.append(line(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {swa}, KV size: 2.00 GB"))
    for tokens in kv_tokens or (pool,):
        lines.append(line(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, KV size: 27.31 GB"))
    if swa is not None:
        lines.append(line(f"SWAKVPool mem usage: 29.31 GB, swa size: {swa}, full size: {pool}"))
    if canary:
        lines.append(
            line(
                f"install_canary: disaggregation_mode={mode} config=CanaryConfig(mode=<CanaryMode.LOG: "
                "'log'>) perturb_config=None n_buffer_groups=1"
            )
        )
    lines.append(
        line(
            f"max_total_num_tokens={pool}, chunked_prefill_size=16384, max_prefill_tokens=16384, "
            f"max_running_requests=128, context_len={context}, available_gpu_mem=3.02 GB"
        )
    )
    lines.append(line("The server is fired up and ready to roll!", ranks=""))
    lines += [line(text, ranks="") for text in after]
    return "\n".join(lines) + "\n"
