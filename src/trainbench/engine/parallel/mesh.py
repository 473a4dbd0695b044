"""ParallelDims: the one object that owns the parallel degrees and hands out sub-meshes.

The device mesh has the named dims (pp, dp, cp, tp), outermost first: tensor parallel
ranks are neighbours (inside one node on a GPU cluster), pipeline stages are farthest
apart. Nothing else multiplies degrees by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ...plan import Layout

MESH_DIMS = ("pp", "dp", "cp", "tp")


@dataclass
class ParallelDims:
    pp: int
    dp: int
    cp: int
    tp: int
    world_size: int
    ep: int = 1

    def __post_init__(self) -> None:
        product = self.pp * self.dp * self.cp * self.tp
        if product != self.world_size:
            raise ValueError(f"PP*DP*CP*TP = {product} but the world has {self.world_size} ranks")
        if (self.dp * self.cp * self.tp) % self.ep:
            raise ValueError(f"EP={self.ep} must divide DP*CP*TP={self.dp * self.cp * self.tp}: "
                             "EP spans the tensor, context and data ranks of a stage")
        self.mesh: DeviceMesh | None = None

    @classmethod
    def from_layout(cls, layout: Layout, world_size: int) -> "ParallelDims":
        return cls(pp=layout.pp, dp=layout.dp, cp=layout.cp, tp=layout.tp, world_size=world_size,
                   ep=layout.ep)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        self.mesh = init_device_mesh(device_type, (self.pp, self.dp, self.cp, self.tp),
                                     mesh_dim_names=MESH_DIMS)
        # FSDP shards parameters over data and context ranks together: both see the
        # same weights and different tokens.
        self.dp_cp_mesh = self.mesh["dp", "cp"]._flatten(mesh_dim_name="dp_cp")
        # A parameter under FSDP and TP lives on (dp_cp, tp); with this flattened twin
        # DTensor reduces it (the gradient norm) in one collective instead of two. An
        # MoE layer under TP is token-local (tp.MoETokenLocal): FSDP shards its
        # parameters over these ranks.
        self.dp_cp_tp_mesh = self.mesh["dp", "cp", "tp"]._flatten(mesh_dim_name="dp_cp_tp")
        self.cp_tp_mesh = None  # made on first use: see __getitem__
        self.ep_mesh = None
        if self.ep_enabled:
            # Megatron-Core's expert layout with ETP 1: a stage's tensor, context and data
            # ranks in that order (tp fastest, as in the dense mesh) split into expert
            # groups of ep neighbours, so EP spans TP first, then CP, then DP. The routed
            # experts are FSDP-sharded over the ranks that hold the same experts
            # (dp_mod_ep). Both dims of one root mesh, as FSDP wants for a parameter that
            # is also a DTensor over another dim.
            self.ep_mesh = init_device_mesh(
                device_type, (self.pp, self.dp * self.cp * self.tp // self.ep, self.ep),
                mesh_dim_names=("pp", "dp_mod_ep", "ep"))
        return self.mesh

    def __getitem__(self, name: str) -> DeviceMesh:
        if self.mesh is None:
            raise RuntimeError("build_mesh() first")
        if name == "dp_cp":
            return self.dp_cp_mesh
        if name == "dp_cp_tp":
            return self.dp_cp_tp_mesh
        if name == "cp_tp":
            # The ranks that hold parts of one sequence in an MoE layer (its balance
            # losses count experts over whole sequences). Only MoE plans ask, so dense
            # runs make no process group for it; every rank asks at the same point
            # (parallelize), as flattening a mesh wants.
            if self.cp_tp_mesh is None:
                self.cp_tp_mesh = self.mesh["cp", "tp"]._flatten(mesh_dim_name="cp_tp")
            return self.cp_tp_mesh
        if name in ("ep", "dp_mod_ep"):
            return self.ep_mesh[name]
        return self.mesh[name]

    def coordinate(self, name: str) -> int:
        """This rank's index along a mesh dim."""
        return self[name].get_local_rank()

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
