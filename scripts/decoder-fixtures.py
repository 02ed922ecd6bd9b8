"""Tiny random-weight decoder rerankers, one per recipe, with small tokenizers carrying the special tokens each
template needs and the references their authors' code computes, for the exactness tests (tests/it/decoders.rs).
CI never runs this (it needs PyTorch); its output is committed under tests/fixtures/models/, tens of kilobytes.

usage: python scripts/decoder-fixtures.py [OUT]   (OUT: tests/fixtures/models; needs torch, transformers,
tokenizers, mxbai-rerank and FlagEmbedding)

Each directory holds config.json, tokenizer.json (with transformers' tokenizer_config.json), model.safetensors and
references.json: (instruction, query, document, max_length) cases, the input ids the reference code builds for
each and the scores it gives in one left-padded batch (and alone, as a check here):
- qwen3-reranker: Qwen3-Reranker's model card code (format_instruction, process_inputs, compute_logits), the
  score logit("yes") - logit("no") from the full vocabulary's logits at the last position;
- qwen3-seq-cls: the same model converted to Qwen3ForSequenceClassification (score = the yes row less the no
  row), under a name that does not tell its recipe (its architecture does); its references are the causal LM's;
- mxbai-rerank-v2: mxbai-rerank's MxbaiRerankV2.prepare_inputs and forward on a Qwen2 model (logit("1") -
  logit("0"));
- bge-reranker-v2-gemma: FlagEmbedding's FlagLLMReranker.compute_score on a Gemma model (logit("Yes")).
max_length is longrank's: the whole input, template included; the reference code's own max_length is derived
from it (the input less its fixed parts, where its code counts them apart).
"""

import json
import os
import shutil
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "models")
SHARED = os.environ.get("LONGRANK_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.2,
}

with open(os.path.join(SHARED, "data", "cranfield", "docs.jsonl")) as f:
    CORPUS = [json.loads(line)["text"] for _, line in zip(range(300), f)]
# The answer words, as whole tokens of their own ("yes", "no") and first pieces ("Yes", "1", "0").
CORPUS += ["yes no Yes No 1 0 yes no", "yes", "no", "Yes", "No"] * 50
CASES = [
    (None, "boundary layer", CORPUS[3], 480),
    (None, "what similarity laws must be obeyed when constructing aeroelastic models", CORPUS[10][:60], 480),
    ("Given a question, find the passage that answers it", "supersonic flow", "flutter", 480),
    (None, "heat transfer in laminar flow", CORPUS[25] + " " + CORPUS[26] + " " + CORPUS[27], 400),
    (None, "boundary layer", "", 480),
]


def chat_tokenizer():
    """Byte-level BPE with Qwen's chat tokens (`<|im_start|>`, `<|im_end|>`, `<think>`, ...) as added tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tokenizer.token_to_id("yes") is not None and tokenizer.token_to_id("no") is not None
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )


def gemma_tokenizer():
    """SentencePiece-style BPE (spaces as ▁) with Gemma's `<pad>`, `<eos>`, `<bos>`, `<unk>`."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"])
    tokenizer.train_from_iterator(CORPUS + ["Given a query A and a passage B, 'Yes' or 'No'."] * 5, trainer)
    bos = tokenizer.token_to_id("<bos>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


def save(name, model, tokenizer, references):
    out = os.path.join(OUT, name)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for extra in ["generation_config.json", "chat_template.jinja"]:
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    with open(os.path.join(out, "references.json"), "w") as f:
        json.dump(references, f, indent=1)
    return out


def references(cases, build, score):
    """The cases' inputs and scores: `build(case)` gives a case's ids (the reference's own, one at a time), and
    `score(cases)` the reference's scores of a batch (left-padded by its code); alone and batched must agree."""
    batched = score(cases)
    alone = [score([case])[0] for case in cases]
    for b, a in zip(batched, alone):
        assert abs(b - a) <= 1e-4 * max(1.0, abs(a)), (b, a)
    spread = max(batched) - min(batched)
    assert spread > 0.05, f"scores too alike to test anything: {batched}"
    return [
        {"instruction": i, "query": q, "document": d, "max_length": n, "ids": build((i, q, d, n)), "score": s}
        for (i, q, d, n), s in zip(cases, batched)
    ]


# Qwen3-Reranker: the model card's code.
QWEN3_PREFIX = (
    '<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct '
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def qwen3():
    tokenizer = chat_tokenizer()
    config = transformers.Qwen3Config(vocab_size=len(tokenizer), tie_word_embeddings=True, rope_theta=1e6, **SHAPE)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")

    def text(case):
        instruction, query, document, _ = case
        instruction = instruction or "Given a web search query, retrieve relevant passages that answer the query"
        return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"

    def build(case):
        max_length = case[3]
        ids = tokenizer(
            [text(case)], padding=False, truncation="longest_first", return_attention_mask=False,
            max_length=max_length - len(prefix) - len(suffix),
        )["input_ids"][0]
        return prefix + ids + suffix

    @torch.no_grad()
    def score(cases):
        inputs = tokenizer.pad({"input_ids": [build(c) for c in cases]}, padding=True, return_tensors="pt")
        logits = model(**inputs).logits[:, -1, :]
        return (logits[:, yes] - logits[:, no]).tolist()

    refs = references(CASES, build, score)
    save("qwen3-reranker", model, tokenizer, refs)

    # The conversion to a sequence classifier: one label, the yes row less the no row.
    config.architectures = ["Qwen3ForSequenceClassification"]
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    converted = transformers.Qwen3ForSequenceClassification(config).eval()
    converted.model.load_state_dict(model.model.state_dict())
    with torch.no_grad():
        weight = model.lm_head.weight
        converted.score.weight.copy_((weight[yes] - weight[no]).unsqueeze(0))
        inputs = tokenizer.pad({"input_ids": [build(c) for c in CASES]}, padding=True, return_tensors="pt")
        check = converted(**inputs).logits[:, 0].tolist()
    for c, r in zip(check, refs):
        assert abs(c - r["score"]) <= 1e-4 * max(1.0, abs(c)), (c, r["score"])
    save("qwen3-seq-cls", converted, tokenizer, refs)


def mxbai():
    from mxbai_rerank import MxbaiRerankV2

    tokenizer = chat_tokenizer()
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=False, rope_theta=1e6, **SHAPE)
    torch.manual_seed(1)
    model = transformers.Qwen2ForCausalLM(config).eval()
    out = save("mxbai-rerank-v2", model, tokenizer, [])
    reranker = MxbaiRerankV2(out, device="cpu", torch_dtype=torch.float32)
    predefined = reranker.predefined_length

    def configured(case):
        reranker.max_length = case[3] - predefined
        reranker.prepare_predefined_inputs()

    def build(case):
        configured(case)
        instruction, query, document, _ = case
        inputs = reranker.prepare_inputs([query], [document], instruction=instruction)
        return [i for i, m in zip(inputs["input_ids"][0].tolist(), inputs["attention_mask"][0].tolist()) if m]

    def score(cases):
        # One call per (instruction, max_length): the package takes them per call.
        scores = {}
        for key in {(c[0], c[3]) for c in cases}:
            group = [(n, c) for n, c in enumerate(cases) if (c[0], c[3]) == key]
            configured(group[0][1])
            queries, documents = [c[1] for _, c in group], [c[2] for _, c in group]
            got = reranker.predict(queries, documents, instruction=key[0]).tolist()
            scores.update({n: s for (n, _), s in zip(group, got)})
        return [scores[n] for n in range(len(cases))]

    save("mxbai-rerank-v2", model, tokenizer, references(CASES, build, score))


def gemma():
    from FlagEmbedding import FlagLLMReranker

    tokenizer = gemma_tokenizer()
    config = transformers.GemmaConfig(
        vocab_size=len(tokenizer), tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        **SHAPE,
    )
    torch.manual_seed(2)
    model = transformers.GemmaForCausalLM(config).eval()
    out = save("bge-reranker-v2-gemma", model, tokenizer, [])
    reranker = FlagLLMReranker(out, use_fp16=False, devices=["cpu"])
    prompt = len(tokenizer("Given a query A and a passage B, determine whether the passage contains an answer to the "
                           "query by providing a prediction of either 'Yes' or 'No'.", add_special_tokens=False)["input_ids"])
    sep = len(tokenizer("\n", add_special_tokens=False)["input_ids"])

    def reference_max(case):
        # FlagEmbedding cuts the pair to its max_length plus the line and the prompt, then adds both.
        instruction = case[0]
        own = len(tokenizer(instruction, add_special_tokens=False)["input_ids"]) if instruction else prompt
        return case[3] - 2 * (sep + own)

    def build(case):
        instruction, query, document, _ = case
        captured = {}
        original = reranker.model.forward

        def capture(**inputs):
            captured["ids"] = [i for i, m in zip(inputs["input_ids"][0].tolist(), inputs["attention_mask"][0].tolist()) if m]
            return original(**inputs)

        reranker.model.forward = capture
        try:
            reranker.compute_score([(query, document)], max_length=reference_max(case), prompt=instruction, batch_size=1)
        finally:
            reranker.model.forward = original
        return captured["ids"]

    def score(cases):
        scores = {}
        for key in {(c[0], reference_max(c)) for c in cases}:
            group = [(n, c) for n, c in enumerate(cases) if (c[0], reference_max(c)) == key]
            pairs = [(c[1], c[2]) for _, c in group]
            got = reranker.compute_score(pairs, max_length=key[1], prompt=key[0], batch_size=len(pairs))
            got = got if isinstance(got, list) else [got]
            scores.update({n: s for (n, _), s in zip(group, got)})
        return [scores[n] for n in range(len(cases))]

    save("bge-reranker-v2-gemma", model, tokenizer, references(CASES, build, score))


if __name__ == "__main__":
    qwen3()
    mxbai()
    gemma()
