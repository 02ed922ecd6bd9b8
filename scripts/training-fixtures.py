"""PyTorch's training step on the tiny models of each family that `longrank train` takes, for the exact-training test
(tests/it/train.rs). CI never runs this (it needs PyTorch); its output is committed beside each model under
tests/fixtures/models/NAME: training.json (the batch, the schedule, the losses) and training.safetensors (every
parameter's gradient after one step, `grad.NAME`, and every parameter after ten updates, `final.NAME`).

usage: python scripts/training-fixtures.py [OUT]   (OUT: tests/fixtures/models; needs what
scripts/model-fixtures.py needs, whose helpers and shapes it uses: each family's model is NAME-train, made as that
script makes NAME but with weights drawn wider, when it is missing)
       python scripts/training-fixtures.py --check DIR   (checkpoints longrank trained, loaded in transformers)

The batch: each of the four queries of references.json with one positive (a document) and two negatives (the next
two), their inputs as references.json cut them (longrank's cut). The loss is longrank's softmax loss (each example's
cross-entropy over its positive and negatives, averaged over examples), in f32, dropout off (`eval()`: longrank
trains without dropout). Ten updates repeat the same batch under AdamW (betas 0.9 and 0.999, eps 1e-8, weight decay
on matrices only, as longrank's) at longrank's schedule (linear warm-up, then linear decay to 0).
"""

import importlib.util
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("model_fixtures", os.path.join(HERE, "model-fixtures.py"))
fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixtures)

OUT = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "--check" else os.path.join(HERE, "..", "tests", "fixtures", "models")
fixtures.OUT = OUT  # where its `cross_encoder` writes
PER_EXAMPLE, LR, WARMUP, STEPS, WEIGHT_DECAY = 3, 1e-3, 3, 10, 0.01


def learning_rate(step):
    """longrank's `train::learning_rate` (step 1-based)."""
    if step <= WARMUP:
        return LR * step / WARMUP
    return LR * max(STEPS - step, 0) / max(STEPS - WARMUP, 1)


def training(name, model_class, uses_types):
    directory = os.path.join(OUT, name)
    with open(os.path.join(directory, "references.json")) as f:
        pairs = json.load(f)["pairs"]
    documents = len({p["document"] for p in pairs})
    queries = len(pairs) // documents
    examples = [[q * documents + (q + j) % documents for j in range(PER_EXAMPLE)] for q in range(queries)]
    rows = [pairs[i] for example in examples for i in example]
    model = model_class.from_pretrained(directory, torch_dtype=torch.float32).eval()
    pad = model.config.pad_token_id or 0
    ids, mask = fixtures.padded([r["ids"] for r in rows], pad)
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if uses_types:
        kwargs["token_type_ids"], _ = fixtures.padded([r["type_ids"] for r in rows], 0)

    def loss():
        scores = model(**kwargs).logits[:, -1].view(len(examples), PER_EXAMPLE)
        return -torch.log_softmax(scores, dim=1)[:, 0].mean()

    first = loss()
    first.backward()
    tensors = {f"grad.{n}": p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad()
    params = dict(model.named_parameters())
    groups = [
        {"params": [p for p in params.values() if p.dim() > 1], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params.values() if p.dim() <= 1], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    losses = []
    for step in range(1, STEPS + 1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
        losses.append(value.item())
    tensors.update({f"final.{n}": p.detach().clone().contiguous() for n, p in params.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "training.safetensors"))
    with open(os.path.join(directory, "training.json"), "w") as f:
        json.dump(
            {
                "examples": examples,
                "loss": first.item(),
                "losses": losses,
                "lr": LR,
                "warmup": WARMUP,
                "steps": STEPS,
                "weight_decay": WEIGHT_DECAY,
            },
            f,
            indent=1,
        )
        f.write("\n")
    print(name, f"loss {first.item():.6f}", f"after ten updates {losses[-1]:.6f}")


def check(trained):
    """Loads each checkpoint longrank's test wrote (LONGRANK_TRAINED_OUT=DIR cargo test --release --test it
    a_training_step) with transformers' AutoModelForSequenceClassification and compares its scores with
    longrank's on the same inputs."""
    for name in sorted(os.listdir(trained)):
        directory = os.path.join(trained, name)
        with open(os.path.join(directory, "scores.json")) as f:
            scores = json.load(f)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
        pad = model.config.pad_token_id or 0
        ids, mask = fixtures.padded([p["ids"] for p in scores["pairs"]], pad)
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if model.config.model_type in ("bert", "electra"):  # the families whose fixtures read token types
            kwargs["token_type_ids"], _ = fixtures.padded([p["type_ids"] for p in scores["pairs"]], 0)
        with torch.no_grad():
            logits = model(**kwargs).logits[:, -1]
        worst = max(abs(a - b) for a, b in zip(logits.tolist(), scores["scores"]))
        print(name, type(model).__name__, f"largest difference {worst:.2e}")
        assert worst < 1e-4, name


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--check":
        return check(sys.argv[2])
    for family, (config_class, model_class, tokenizer, labels, uses_types, extra) in fixtures.trained_families().items():
        name = f"{family}-train"
        if not os.path.exists(os.path.join(OUT, name, "references.json")):
            # Weights drawn wider than the configurations' 0.02, so that scores differ and every gradient that is
            # not zero in exact arithmetic is well above rounding.
            fixtures.cross_encoder(
                name, config_class, model_class, tokenizer(), labels, uses_types, initializer_range=0.3, **extra
            )
        training(name, model_class, uses_types)
    # ModernBERT, mean pooling and two labels: the head's norm and pooling on the graph, its local window shorter
    # than the inputs.
    if not os.path.exists(os.path.join(OUT, "modernbert-train", "references.json")):
        fixtures.modernbert("modernbert-train", "mean", 2, initializer_range=0.3)
    training("modernbert-train", transformers.ModernBertForSequenceClassification, False)


if __name__ == "__main__":
    main()
