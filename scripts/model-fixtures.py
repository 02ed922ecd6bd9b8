"""Tiny random-weight models of each family longrank loads beyond BERT, with small tokenizers of each kind and the
references transformers computes, for the exactness tests (tests/it/families.rs). CI never runs this (it needs
PyTorch); its output is committed under tests/fixtures/models/, a few hundred kilobytes in all.

usage: python scripts/model-fixtures.py [OUT]   (OUT: tests/fixtures/models; needs torch, transformers,
sentence-transformers and tokenizers)

Each model directory holds config.json, tokenizer.json, model.safetensors and references.json: pairs of a query
and a document, the model's input built from the tokenizer's own post-processor (never transformers' tokenizer
wrapper, which drops pair type ids) and cut as longrank cuts (the query to max_query_tokens, the document to
what is left of max_length), and the logits transformers gives for them in one padded batch. A bi-encoder's
references are its texts' inputs and embeddings (mean pooling over the mask, normalized), checked here against
sentence-transformers' own encode. The tokenizers' trainers break ties differently from run to run: a new run
makes equivalent fixtures, not the same bytes (the committed ones are checked together with their references).
"""

import json
import os
import shutil
import sys

import torch
import transformers
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers import models as st_models
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "models")
SHARED = os.environ.get("LONGRANK_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
MAX_LENGTH, MAX_QUERY_TOKENS = 48, 8
SHAPE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}

# What the tokenizers learn from: cranfield's first documents (abstracts of aeronautics papers).
with open(os.path.join(SHARED, "data", "cranfield", "docs.jsonl")) as f:
    CORPUS = [json.loads(line)["text"] for _, line in zip(range(300), f)]
QUERIES = [
    "boundary layer",
    "what similarity laws must be obeyed when constructing aeroelastic models of heated high speed aircraft",
    "supersonic flow",
    "heat transfer in laminar flow over a flat plate with suction",
]
DOCUMENTS = [CORPUS[3], CORPUS[10][:60], "flutter", CORPUS[25] + " " + CORPUS[26]]


def bert_template(tokenizer):
    """BERT's template, `[CLS] A [SEP] B [SEP]` (token types 0, then 1 with `types`)."""
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    return processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )


BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece():
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=BERT_SPECIALS))
    tokenizer.post_processor = bert_template(tokenizer)
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def byte_level_bpe(specials, template):
    """Byte-level BPE (RoBERTa's kind, ModernBERT's), the post-processor `template(tokenizer)`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = template(tokenizer)
    return tokenizer


def xlm_template(_):
    """XLM-R's template: `<s> A </s></s> B </s>`, token types all 0."""
    return processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )


def sentencepiece_unigram(specials, template, unk):
    """SentencePiece's Unigram (XLM-R's kind, DeBERTa-v3's), the post-processor `template(tokenizer)`."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token=unk)
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = template(tokenizer)
    return tokenizer


XLM_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def cut(encoding, n):
    if len(encoding.ids) > n:
        encoding.truncate(n)
    return encoding


def pair_input(tokenizer, query, document):
    """longrank's cut (model/tokenize.rs): the query to MAX_QUERY_TOKENS, the document to what is left."""
    added = tokenizer.post_processor.num_special_tokens_to_add(True)
    q = cut(tokenizer.encode(query, add_special_tokens=False), min(MAX_QUERY_TOKENS, MAX_LENGTH - added - 1))
    d = cut(tokenizer.encode(document, add_special_tokens=False), MAX_LENGTH - len(q.ids) - added)
    both = tokenizer.post_process(q, d, add_special_tokens=True)
    return both.ids, both.type_ids


def single_input(tokenizer, text):
    added = tokenizer.post_processor.num_special_tokens_to_add(False)
    one = tokenizer.post_process(cut(tokenizer.encode(text, add_special_tokens=False), MAX_LENGTH - added))
    return one.ids, one.type_ids


def padded(rows, pad):
    n = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (n - len(r)) for r in rows]), torch.tensor(
        [[1] * len(r) + [0] * (n - len(r)) for r in rows]
    )


def save(directory, model, tokenizer, references):
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    if model.config.model_type in ("modernbert", "deberta-v2"):
        # As their repositories have it: transformers' wrapper learns the special tokens from here.
        specials = {f"{k}_token": f"[{k.upper()}]" for k in ["pad", "unk", "cls", "sep", "mask"]}
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MAX_LENGTH, **specials}, f)
    with open(os.path.join(directory, "references.json"), "w") as f:
        json.dump(references, f, indent=1)
        f.write("\n")


def cross_encoder(name, config_class, model_class, tokenizer, labels, uses_types, **extra):
    pad = tokenizer.token_to_id("[PAD]")
    if pad is None:
        pad = tokenizer.token_to_id("<pad>")
    config = config_class(vocab_size=tokenizer.get_vocab_size(), num_labels=labels, pad_token_id=pad, **extra)
    torch.manual_seed(len(name))
    model = model_class(config).eval()
    pairs = [(q, d) for q in QUERIES for d in DOCUMENTS]
    inputs = [pair_input(tokenizer, q, d) for q, d in pairs]
    ids, mask = padded([i for i, _ in inputs], pad)
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if uses_types:
        kwargs["token_type_ids"], _ = padded([t for _, t in inputs], 0)
    with torch.no_grad():
        logits = model(**kwargs).logits
    references = {
        "family": config.model_type,
        "max_length": MAX_LENGTH,
        "max_query_tokens": MAX_QUERY_TOKENS,
        "pairs": [
            {"query": q, "document": d, "ids": i, "type_ids": t, "logit": float(logits[n, labels - 1])}
            for n, ((q, d), (i, t)) in enumerate(zip(pairs, inputs))
        ],
    }
    directory = os.path.join(OUT, name)
    save(directory, model, tokenizer, references)
    if labels == 1:
        # How users load such a model: sentence-transformers' CrossEncoder gives the same logits for pairs that
        # need no cut (its tokenizer wrapper has no query budget).
        whole = [n for n, ((q, d), (i, _)) in enumerate(zip(pairs, inputs)) if tokenizer.encode(q, d).ids == i]
        loaded = CrossEncoder(directory, max_length=MAX_LENGTH, activation_fn=torch.nn.Identity())
        predicted = loaded.predict([pairs[n] for n in whole])
        mine = [references["pairs"][n]["logit"] for n in whole]
        assert whole and max(abs(a - b) for a, b in zip(predicted, mine)) < 1e-5, (name, predicted, mine)
    print(name, config.model_type, f"{labels} label(s)", f"{len(pairs)} pairs")


def bi_encoder(name, config_class, model_class, tokenizer, **extra):
    pad = next(i for i in map(tokenizer.token_to_id, ["<pad>", "[PAD]"]) if i is not None)
    config = config_class(vocab_size=tokenizer.get_vocab_size(), pad_token_id=pad, **extra)
    torch.manual_seed(len(name))
    model = model_class(config).eval()
    texts = QUERIES + DOCUMENTS
    inputs = [single_input(tokenizer, t) for t in texts]
    ids, mask = padded([i for i, _ in inputs], pad)
    with torch.no_grad():
        states = model(input_ids=ids, attention_mask=mask).last_hidden_state
    mean = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    embeddings = torch.nn.functional.normalize(mean, dim=1)
    directory = os.path.join(OUT, name)
    references = {
        "family": config.model_type,
        "max_length": MAX_LENGTH,
        "texts": [
            {"text": t, "ids": i, "embedding": e.tolist()} for t, (i, _), e in zip(texts, inputs, embeddings)
        ],
    }
    save(directory, model, tokenizer, references)
    transformer = st_models.Transformer(directory, max_seq_length=MAX_LENGTH)
    pooling = st_models.Pooling(config.hidden_size, pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling, st_models.Normalize()]).save(directory)
    # sentence-transformers writes tokenizer.json again through transformers' wrapper: the one made here stays.
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    for stray in ["README.md", "config_sentence_transformers.json"]:
        if os.path.exists(os.path.join(directory, stray)):
            os.remove(os.path.join(directory, stray))
    # How users load it: sentence-transformers' own encode agrees on texts that need no cut.
    loaded = SentenceTransformer(directory)
    whole = [t for t, (i, _) in zip(texts, inputs) if tokenizer.encode(t).ids == i]
    theirs = loaded.encode(whole, convert_to_tensor=True)
    mine = torch.stack([e for t, e in zip(texts, embeddings) if t in whole])
    assert (theirs - mine).abs().max() < 1e-5, name
    print(name, config.model_type, "bi-encoder", f"{len(texts)} texts")


DEBERTA_V3 = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128,
    relative_attention=True, position_buckets=16, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
    position_biased_input=False, type_vocab_size=0, norm_rel_ebd="layer_norm", share_att_key=True,
)


# ModernBERT: three layers (global, local, global), a local window of 16 shorter than most inputs (48).
MODERNBERT = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48, max_position_embeddings=128,
    local_attention=16, global_attn_every_n_layers=2,
)


def modernbert(name, pooling, labels, **extra):
    """A ModernBERT cross-encoder pooling by `pooling` (`cls` or `mean`), its BPE tokenizer's specials its own."""
    tokenizer = byte_level_bpe(BERT_SPECIALS, bert_template)
    ids = {name: tokenizer.token_to_id(name) for name in ["[CLS]", "[SEP]"]}
    cross_encoder(
        name, transformers.ModernBertConfig, transformers.ModernBertForSequenceClassification, tokenizer, labels,
        False, classifier_pooling=pooling, cls_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"],
        bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"], **MODERNBERT, **extra,
    )


def trained_families():
    """The cross-encoders of the families longrank also trains (scripts/training-fixtures.py): name -> (config
    class, model class, the tokenizer's maker, labels, whether it reads token types, config options)."""
    shape = dict(SHAPE, max_position_embeddings=MAX_LENGTH + 16)
    roberta_shape = dict(SHAPE, max_position_embeddings=MAX_LENGTH + 18, type_vocab_size=1)
    roberta_template = lambda _: processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    distil = {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": MAX_LENGTH + 16}
    return {
        "bert": (transformers.BertConfig, transformers.BertForSequenceClassification, wordpiece, 1, True, shape),
        "roberta": (
            transformers.RobertaConfig, transformers.RobertaForSequenceClassification,
            lambda: byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], roberta_template), 1, False,
            roberta_shape,
        ),
        "xlm-roberta": (
            transformers.XLMRobertaConfig, transformers.XLMRobertaForSequenceClassification,
            lambda: sentencepiece_unigram(XLM_SPECIALS, xlm_template, "<unk>"), 2, False, roberta_shape,
        ),
        "electra": (
            transformers.ElectraConfig, transformers.ElectraForSequenceClassification, wordpiece, 1, True,
            dict(shape, embedding_size=16),
        ),
        "distilbert": (
            transformers.DistilBertConfig, transformers.DistilBertForSequenceClassification, wordpiece, 2, False, distil,
        ),
        # DeBERTa-v3's shape: relative attention in 16 buckets under inputs of 48, no absolute positions nor token
        # types, the context pooler.
        "deberta-v3": (
            transformers.DebertaV2Config, transformers.DebertaV2ForSequenceClassification,
            lambda: sentencepiece_unigram(BERT_SPECIALS, bert_template, "[UNK]"), 1, False,
            dict(DEBERTA_V3, pooler_hidden_size=32, pooler_hidden_act="gelu"),
        ),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (config_class, model_class, tokenizer, labels, uses_types, extra) in trained_families().items():
        if name != "bert":  # BERT's tiny models are the tests' own (tests/it/fixtures.rs) and training's
            cross_encoder(name, config_class, model_class, tokenizer(), labels, uses_types, **extra)
    # The head's both poolings.
    for pooling, labels in [("cls", 1), ("mean", 2)]:
        modernbert(f"modernbert-{pooling}", pooling, labels)
    bi_encoder("xlm-roberta-bi", transformers.XLMRobertaConfig, transformers.XLMRobertaModel,
               sentencepiece_unigram(XLM_SPECIALS, xlm_template, "<unk>"), **roberta_shape)
    # The other backbones as sentence-transformers bi-encoders (gte-modernbert-base's kind; DeBERTa's).
    tokenizer = byte_level_bpe(BERT_SPECIALS, bert_template)
    ids = {name: tokenizer.token_to_id(name) for name in ["[CLS]", "[SEP]"]}
    bi_encoder("modernbert-bi", transformers.ModernBertConfig, transformers.ModernBertModel, tokenizer,
               cls_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"],
               eos_token_id=ids["[SEP]"], **MODERNBERT)
    bi_encoder("deberta-v3-bi", transformers.DebertaV2Config, transformers.DebertaV2Model,
               sentencepiece_unigram(BERT_SPECIALS, bert_template, "[UNK]"), **DEBERTA_V3)


if __name__ == "__main__":
    main()
