"""Synapse's one entry point. All logic lives in synapse/; this file only hands Hydra's config over.

    python train.py                                   # the embedded default run
    python train.py teacher=vit_base student=resnet50 data=synthetic trainer=gpu
    python train.py -m data.batch_size=32,64          # a sweep
"""
import hydra
from omegaconf import DictConfig

import synapse.config  # noqa: F401  (registers the structured-config schema)
from synapse.launch.run import run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
