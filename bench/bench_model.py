"""Training step of a transformers MoE model through the registered experts implementations.

A Qwen3-MoE model (4 layers, hidden 2048, 8 experts top-2, expert hidden 2048, 16 heads of 128,
vocab 32k; bf16 parameters, AdamW) trains on 16k tokens per step (8 x 2048) with the model's own
experts (``experts_implementation="grouped_mm"``: bf16 ``torch._grouped_mm``) and ours
(``"cute_bf16"``, ``"cute_fp8_rowwise"`` (``gemm="auto"``: on an H200 the project's own FP8 grouped
GEMM, elsewhere torch's), and on sm_90 ``"cute_fp8_rowwise_sm90"``: the project's own FP8 grouped
GEMM, ``gemm="cute"``; ``torch_bindings.moe.hf.register``). Reported: ms per step
(median of timed steps, each synchronized), the speedup over the model's own experts, peak memory.

Run (GPU machine, project root on PYTHONPATH, transformers installed)::

    python -m bench.bench_model [--quick] [--out DIR]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from bench.common.cli import make_parser, output_paths, progress
from bench.common.device import cuda_or_none
from bench.common.report import report

IMPLEMENTATIONS = ("grouped_mm", "cute_bf16", "cute_fp8_rowwise")
#: On an sm_90 GPU also: fp8_rowwise on the project's own grouped GEMM (``gemm="cute"``).
OWN_GEMM = "cute_fp8_rowwise_sm90"


def _model(implementation: str, layers: int):
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=32768,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=2048,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    model.set_experts_implementation(implementation)
    return model


def _train_step(model, opt, ids) -> torch.Tensor:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _step_ms(implementation: str, layers: int, batch: int, seq: int, steps: int) -> dict:
    model = _model(implementation, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator("cuda").manual_seed(1)
    ids = torch.randint(0, 32768, (batch, seq), device="cuda", generator=gen)
    for _ in range(3):
        _train_step(model, opt, ids)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = _train_step(model, opt, ids)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    row = {
        "experts": implementation,
        "ms/step": statistics.median(times),
        "peak GiB": torch.cuda.max_memory_allocated() / 2**30,
        "loss": float(loss),
    }
    del model, opt
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    if cuda_or_none("bench_model") is None:
        return 2
    try:
        from torch_bindings.moe import hf

        hf.register()
    except ImportError as error:
        print(f"error: bench_model needs transformers ({error})", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}")
    from torch_bindings.moe.grouped_mm import cute_gemm_reason

    names = IMPLEMENTATIONS + ((OWN_GEMM,) if cute_gemm_reason(torch.device("cuda")) is None else ())
    rows = []
    for name in names:
        progress(f"Qwen3-MoE training step: experts {name}")
        rows.append(_step_ms(name, layers=4, batch=8, seq=2048, steps=5 if args.quick else 10))
    own = rows[0]["ms/step"]
    for row in rows:
        row["vs model's own"] = own / row["ms/step"]
    report(
        rows,
        list(rows[0]),
        "Qwen3-MoE training step",
        json_path=output_paths(args.out, "model")[0],
        panel_key=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
