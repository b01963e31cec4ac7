# Config-registry function of main_na.log, in the form moescope plan
# --torchtitan-py writes (written for this test, not from a run).
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.qwen3.config_registry import qwen3_30b_a3b
from torchtitan.trainer import Trainer


def moescope_qwen3_30b_a3b_8gpu() -> Trainer.Config:
    config = qwen3_30b_a3b()
    config.training.num_tokens_per_microbatch_per_dp_rank = 16384  # lbs 4 × seq 4096
    config.training.num_tokens_per_train_step = 131072  # global batch 32 sequences (grad_accum 1)
    config.training.max_context_length = 4096
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 8
    config.parallelism.fsdp_reshard_after_forward = "default"
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1
    config.parallelism.expert_parallel_degree = 1
    config.compile.enable = True
    config.compile.components = ["model", "loss"]
    config.activation_checkpoint = SelectiveAC.Config()
    return config
