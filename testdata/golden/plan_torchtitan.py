# Config-registry function for torchtitan at commit b5bcd76c66d0acb1a08b176d9639425bc55e0b2a.
# Run: MODULE=<this module> CONFIG=moescope_qwen3_30b_a3b_512gpu ./run_train.sh on 512 GPUs.

from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.qwen3.config_registry import qwen3_30b_a3b
from torchtitan.trainer import Trainer


def moescope_qwen3_30b_a3b_512gpu() -> Trainer.Config:
    config = qwen3_30b_a3b()
    config.training.num_tokens_per_microbatch_per_dp_rank = 8192  # lbs 2 × seq 4096
    config.training.num_tokens_per_train_step = 16777216  # global batch 4096 sequences (grad_accum 4)
    config.training.max_context_length = 4096
    config.training.mixed_precision_param = "bfloat16"
    config.training.mixed_precision_reduce = "float32"
    config.parallelism.data_parallel_replicate_degree = 8
    config.parallelism.data_parallel_shard_degree = 64
    config.parallelism.fsdp_reshard_after_forward = "default"
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1
    config.parallelism.expert_parallel_degree = 8
    config.compile.enable = True
    config.compile.components = ["model", "loss"]
    config.activation_checkpoint = SelectiveAC.Config()
    config.loss = getattr(config.loss, "loss_fn", config.loss)  # one piece, as priced (--loss-chunks 1)
    config.training.disable_cuda_graphs = True  # launched from the host, as priced (--cuda-graphs none)
    return config
