# python experiments/extract_step_noise.py
"""The step-to-step noise mode=simulate draws from (synapse/simulation/step_noise/<accelerator>.json),
cut from the recorded fault-free streams in tests/data: each steady step's time over its stream's
median, each rank's compute over its own median (``synapse.simulation.noise_from_stream``).

cpu: the default demo's models on 3 CPU ranks of this kind of machine (two 120-step runs);
cuda: 2 x H200 (ViT-L -> ResNet-152 failover run without load, 120 steps) and one H200
(ViT-B -> ResNet-50, 1,500 steps). A simulated run bootstraps these ratios.

The host's time between steps (``host_gaps_s``) from the same streams, except the one-H200 run's: its
``time`` is not taken at the step's end (a tenth of its gaps come out negative, down to -0.05 s),
so on CUDA only the 2 x H200 run gives gaps.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from synapse.simulation import noise_from_stream  # noqa: E402

STREAMS = REPO / "tests" / "data" / "fault_free_streams"
SOURCES = {
    "cpu": ["cpu3_demo_models_none_a.jsonl", "cpu3_demo_models_none_b.jsonl"],
    "cuda": ["h200x2_failover_no_load.jsonl", "h200_k1_vit_base_resnet50_long.jsonl"],
}
# streams whose record times are not taken at the step's end: their ratios count, their gaps do not
NO_GAPS = {"h200_k1_vit_base_resnet50_long.jsonl"}
OUT = REPO / "synapse" / "simulation" / "step_noise"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for accelerator, names in SOURCES.items():
        step, compute, gaps = [], [], []
        for name in names:
            noise = noise_from_stream(STREAMS / name)
            step += noise.step_ratios
            compute += noise.compute_ratios
            gaps += [] if name in NO_GAPS else noise.host_gaps_s
        record = {"source": ", ".join(f"tests/data/fault_free_streams/{n}" for n in names),
                  "command": "python experiments/extract_step_noise.py",
                  "step_ratios": [round(r, 5) for r in step], "compute_ratios": [round(r, 5) for r in compute],
                  "host_gaps_s": [round(g, 6) for g in gaps]}
        (OUT / f"{accelerator}.json").write_text(json.dumps(record) + "\n")
        print(f"{accelerator}: {len(step)} step ratios, {len(compute)} compute ratios, {len(gaps)} host gaps "
              f"(median {sorted(gaps)[len(gaps) // 2]:.4f} s) from {record['source']}")


if __name__ == "__main__":
    main()
