"""Published reference performance from the seeds (all on H100 SXM). Pure data.

step time (s), tokens/s, MFU (%, the seed's own convention) and days to train 1T tokens
(None where the seed prints n/a). Where two seeds measured the same cell, the newest is
kept (Nemotron-4 340B: seed 003 over seed 000, whose 128-GPU column is kept as the only one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .recipes import SEED_LLAMA2, SEED_LLAMA31, SEED_NEMOTRON4, SEED_NEMOTRON4_340B_OLD, SEED_NEMOTRONH


@dataclass(frozen=True)
class Reference:
    workload: str
    size: str
    dtype: str
    gpu_type: str
    gpus: int
    step_time_s: float
    tokens_per_s: float
    mfu_pct: float
    days_1t: float | None
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


def _table(workload, size, dtype, source, gpus, step, tokens, mfu, days):
    assert len(gpus) == len(step) == len(tokens) == len(mfu) == len(days)
    return [Reference(workload, size, dtype, "h100", g, s, t, m, d, source)
            for g, s, t, m, d in zip(gpus, step, tokens, mfu, days)]


_L8 = (8, 16, 32, 64, 128)
_L70 = (64, 128, 256, 512, 1024, 2048)
_N15 = (16, 32, 64, 128, 256, 512, 1024, 2048)
_N340 = (256, 512, 1024, 2048)
_NH = (32, 64, 128, 256, 512, 1024, 2048)

REFERENCES: list[Reference] = [
    *_table("pretrain_llama3.1", "8b", "bf16", SEED_LLAMA31, _L8,
            (12.27, 12.3, 12.32, 12.33, 12.33), (85459, 170500, 340447, 680341, 1360683),
            (62.47, 62.31, 62.21, 62.16, 62.16), (135.43, 67.88, 34, 17.01, 8.51)),
    *_table("pretrain_llama3.1", "8b", "fp8", SEED_LLAMA31, _L8,
            (9.33, 9.36, 9.43, 9.48, 9.54), (112388, 224055, 444783, 884874, 1758618),
            (41.07, 40.94, 40.64, 40.42, 40.17), (102.98, 51.66, 26.02, 13.08, 6.58)),
    *_table("pretrain_llama3.1", "70b", "bf16", SEED_LLAMA31, _L70,
            (14.66, 14.67, 14.68, 14.67, 14.65, 14.66),
            (71526, 142955, 285716, 571821, 1145202, 2288843),
            (54.32, 54.29, 54.25, 54.29, 54.36, 54.32), (161.82, 80.96, 40.51, 20.24, 10.11, 5.06)),
    *_table("pretrain_llama3.1", "70b", "fp8", SEED_LLAMA31, _L70,
            (9.86, 9.95, 10, 10.07, 10.08, 10.15),
            (106346, 210769, 419430, 833030, 1664406, 3305855),
            (40.38, 40.02, 39.82, 39.54, 39.50, 39.23), (108.83, 54.91, 27.59, 13.89, 6.95, 3.5)),
    # The seed's 405B table: its 32/64/128-GPU columns are the proxies (8/30/62 layers).
    *_table("pretrain_llama3.1", "405b-proxy", "bf16", SEED_LLAMA31, (32, 64, 128),
            (5.4, 10.1, 19.62), (97090, 51910, 53444), (55.23, 52.52, 55.31), (None, None, None)),
    *_table("pretrain_llama3.1", "405b", "bf16", SEED_LLAMA31, (512, 1024, 2048),
            (19.78, 19.84, 19.87), (106024, 211406, 422175), (55.47, 55.31, 55.22),
            (109.16, 54.75, 27.42)),
    *_table("pretrain_llama3.1", "405b-proxy", "fp8", SEED_LLAMA31, (32, 64, 128),
            (3.53, 6.32, 12.18), (148524, 82957, 86090), (42.24, 41.97, 44.55), (None, None, None)),
    *_table("pretrain_llama3.1", "405b", "fp8", SEED_LLAMA31, (512, 1024, 2048),
            (12.37, 12.42, 12.56), (169535, 337706, 667883), (44.35, 44.17, 43.68),
            (68.27, 34.27, 17.33)),
    *_table("pretrain_llama2", "70b", "bf16", SEED_LLAMA2, _L70,
            (6.999, 7.072, 7.153, 7.091, 7.084, 7.066),
            (74908.99, 148271.49, 293184.96, 591496.83, 1184162.62, 2374358.34),
            (52.59, 52.04, 51.45, 51.90, 51.95, 52.09), (154.51, 78.06, 39.48, 19.57, 9.77, 4.87)),
    *_table("pretrain_llama2", "70b", "fp8", SEED_LLAMA2, _L70,
            (4.324, 4.556, 4.959, 5.043, 5.062, 4.93),
            (121250.69, 230152.77, 422898.16, 831708.11, 1657172.66, 3403086.41),
            (42.54, 40.37, 37.09, 36.47, 36.34, 37.31), (95.46, 50.29, 27.37, 13.92, 6.98, 3.40)),
    *_table("pretrain_nemotron4", "15b", "bf16", SEED_NEMOTRON4, _N15,
            (2.66, 2.66, 2.67, 2.67, 2.68, 2.71, 2.74, 2.78),
            (98550, 197101, 392725, 785450, 1565039, 3095427, 6123072, 12069940),
            (66.07, 66.07, 65.82, 65.82, 65.57, 64.85, 64.14, 63.21),
            (117.44, 58.72, 29.47, 14.74, 7.4, 3.74, 1.89, 0.96)),
    *_table("pretrain_nemotron4", "15b", "fp8", SEED_NEMOTRON4, _N15,
            (1.98, 1.98, 1.98, 1.99, 2, 2.02, 2.03, 2.09),
            (132396, 264792, 529584, 1053845, 2097152, 4152776, 8264638, 16054752),
            (44.35, 44.35, 44.35, 44.13, 43.91, 43.48, 43.26, 42.02),
            (87.42, 43.71, 21.86, 10.98, 5.52, 2.79, 1.4, 0.72)),
    *_table("pretrain_nemotron4", "340b", "bf16", SEED_NEMOTRON4_340B_OLD, (128,),
            (4.61,), (28432,), (55.38,), (407,)),
    *_table("pretrain_nemotron4", "340b", "bf16", SEED_NEMOTRON4, _N340,
            (4.36, 4.39, 4.41, 4.43), (60125, 119428, 237772, 473398),
            (58.56, 58.16, 57.89, 57.63), (192.5, 96.91, 48.68, 24.45)),
    *_table("pretrain_nemotron4", "340b", "fp8", SEED_NEMOTRON4_340B_OLD, (128,),
            (3.16,), (41478,), (40.38,), (279,)),
    *_table("pretrain_nemotron4", "340b", "fp8", SEED_NEMOTRON4, _N340,
            (2.93, 2.97, 3, 3.05), (89469, 176528, 349525, 687591),
            (43.55, 42.96, 42.53, 41.83), (129.36, 65.57, 33.11, 16.83)),
    *_table("pretrain_nemotronh", "56b", "fp8", SEED_NEMOTRONH, _NH,
            (15.119, 15.058, 15.496, 15.892, 15.586, 15.678, 15.723),
            (52016, 104454, 203003, 395888, 807321, 1605168, 3201148),
            (28.23, 28.35, 27.55, 26.86, 27.39, 27.23, 27.15),
            (222.51, 110.81, 57.01, 29.24, 14.34, 7.21, 3.62)),
]

# Superseded cells of the older seed 000 (Nemotron-4 340B, VP=12, GBS = 2 x nodes),
# kept for the record and for `trainbench show`; comparisons use REFERENCES.
SUPERSEDED: list[Reference] = [
    *_table("pretrain_nemotron4", "340b", "bf16", SEED_NEMOTRON4_340B_OLD, _N340,
            (4.67, 4.7, 4.73, 4.84), (56134, 111551, 221686, 433296),
            (54.67, 54.32, 53.98, 52.75), (206, 104, 52, 27)),
    *_table("pretrain_nemotron4", "340b", "fp8", SEED_NEMOTRON4_340B_OLD, _N340,
            (3.21, 3.26, 3.34, 3.49), (81665, 160825, 313945, 600903),
            (39.75, 39.14, 38.20, 36.56), (142, 72, 37, 19)),
]


def find_reference(workload: str, size: str, dtype: str, gpus: int,
                   gpu_type: str = "h100") -> Reference | None:
    for ref in REFERENCES:
        if (ref.workload, ref.size, ref.dtype, ref.gpus, ref.gpu_type) == (
                workload, size, dtype, gpus, gpu_type):
            return ref
    return None


def references_for(workload: str, size: str | None = None) -> list[Reference]:
    return [r for r in REFERENCES if r.workload == workload and (size is None or r.size == size)]
