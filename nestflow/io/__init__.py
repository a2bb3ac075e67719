"""Files users keep: parameters as safetensors, programs as protobuf (never pickles).

nf.io.save_params(scope, program, "params.safetensors")
nf.io.load_params(scope, program, "params.safetensors")
nf.io.save_inference_model("model_dir", ["x"], [prediction], main, scope)
program, feed_names, fetch_names, scope = nf.io.load_inference_model("model_dir")

Feeding training (nestflow.io.data): Dataset, TensorDataset, DataLoader (batches, seeded shuffle,
a prefetch thread), pad_sequences, BatchSampler, DistributedBatchSampler.
"""

from nestflow.io.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedBatchSampler,
    TensorDataset,
    default_collate,
    pad_sequences,
)
from nestflow.io.inference import load_inference_model, save_inference_model
from nestflow.io.params import load_params, persistable_vars, save_params

__all__ = [
    "BatchSampler",
    "DataLoader",
    "Dataset",
    "DistributedBatchSampler",
    "TensorDataset",
    "default_collate",
    "pad_sequences",
    "load_inference_model",
    "load_params",
    "persistable_vars",
    "save_inference_model",
    "save_params",
]
