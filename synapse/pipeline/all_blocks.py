"""Every block of both models on every pipeline rank: the stage a rank runs is a view of some of
them, and a live re-partition assembles the new stage from the same blocks."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from synapse.config import TeacherConfig
from synapse.engine import ComputeSetup
from synapse.models import block_parameter_names, build_model, load_weights, model_blocks
from synapse.partitioning import Placement
from synapse.pipeline.stage import FusedStage


@dataclass
class AllBlocks:
    """Every block of both models, held by every rank; a stage is a view of some of them.

    Built once per process from the seed and the teacher file. Blocks outside this rank's
    stage stay on the CPU untouched; a live re-partition assembles the new stage from them.
    """

    teacher: list[torch.nn.Module]
    student: list[torch.nn.Module]
    student_names: list[dict[str, str]]  # per block: local name -> the student's state_dict name

    def stage(self, rank: int, partition: Placement, setup: ComputeSetup
              ) -> tuple[FusedStage, dict[str, torch.Tensor]]:
        """This rank's FusedStage and the original names of the student tensors it owns."""
        student_range = partition.student_range(rank)
        module = FusedStage([self.teacher[i] for i in partition.teacher_range(rank)],
                            [self.student[i] for i in student_range], is_first=partition.stage_of(rank) == 0,
                            channels_last_wire=setup.channels_last)
        module = setup.prepare_model(module)
        # Look the tensors up after the move to the device: those are the ones training updates.
        owned = {}
        for local_index, block_index in enumerate(student_range):
            block_state = module.student[local_index].state_dict(keep_vars=True)
            for local, original in self.student_names[block_index].items():
                owned[original] = block_state[local]
        return module, owned

    def release(self, rank: int, old: Placement, new: Placement) -> None:
        """Blocks this rank no longer runs go back to the CPU (they free device memory)."""
        for blocks, before, after in ((self.teacher, old.teacher_range(rank), new.teacher_range(rank)),
                                      (self.student, old.student_range(rank), new.student_range(rank))):
            for index in set(before) - set(after):
                blocks[index].to("cpu")


def build_all_blocks(teacher_cfg: TeacherConfig, partition: Placement, teacher_weights: str, parts) -> AllBlocks:
    info = parts.info
    teacher = build_model(teacher_cfg.name, info.num_classes, info.in_chans, info.image_size)
    load_weights(teacher, teacher_weights, what="teacher.checkpoint")
    teacher_blocks, student_blocks = model_blocks(teacher), model_blocks(parts.student)
    partition.check_block_counts(len(teacher_blocks), len(student_blocks))
    return AllBlocks(teacher_blocks, student_blocks, block_parameter_names(parts.student, student_blocks))
