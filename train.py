"""Synapse's one entry point. All logic lives in synapse/ (the composition root is synapse/app.py);
this file only hands Hydra's config over. ``synapse ...`` (installed console command) runs the same job.

    python train.py                                   # the embedded default run
    python train.py teacher=vit_base student=resnet50 data=synthetic trainer=gpu
    python train.py -m data.batch_size=32,64          # a sweep
"""
from synapse.app import main

if __name__ == "__main__":
    main()
