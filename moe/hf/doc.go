// Package hf reads and writes what Hugging Face's transformers reads and
// writes for the supported MoE model types: config.json normalized into a
// moe.Config (behaviour as fields, each default from that model type's
// transformers config class), the built-in configs embedded from models/
// (each with a _source line), and checkpoints under HF tensor names, one
// safetensors file or a sharded model.safetensors.index.json, checked
// against the model's parameter list with every problem reported at once,
// and the token files a training loss reads (ReadTokens).
// Its tests run the reference model on HF checkpoints against PyTorch.
//
// It imports moe, moe/safetensors and internal/fileio; flops, memory and
// everything above load models through it.
package hf
