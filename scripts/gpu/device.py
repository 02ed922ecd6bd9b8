"""The device run: verifies and measures longrank's CUDA path on the GPU machine in one command, beside PyTorch on
the same GPU, same weights and inputs. Started by device.sh from the pack (scripts/gpu/pack.sh builds it here).

usage: python3 device.py --pack DIR --out DIR [--device cuda|cpu] [--model-dir DIR] [--quick]

Parts, in order (correctness first): env (versions, the GPU's clocks and power before the work, the bf16 matrix rate
measured), models (BERT-base and MiniLM-L6 for every part, every other encoder family in the MiniLM's shape for
correctness), correctness, speed (the clocks again after it: a throttled GPU shows there), e2e (the CUDA and BLAS
libraries the server process mapped, with their versions), train, decoder (a Qwen3-Reranker of the 0.6B's shape
against transformers' causal LM), long (ModernBERT-base's shape at 8,192 tokens). --parts runs some of them (env
and models always). $OUT/summary.json is
rewritten after each part, so a run cut off still reports what it finished; a part that fails records its error
and the next one runs. Without PyTorch (the CPU rehearsal in CI) the PyTorch half of each part says so and the
models come from --model-dir. Tolerances (‖a − b‖ / ‖b‖ over a check batch's logits, PyTorch f32 the
reference, TF32 off): longrank f32 1e-4 (and 1e-4 against longrank on the CPU), f16 1e-2, bf16 5e-2.
"""

import argparse
import inspect
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import traceback
import urllib.request

try:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
except ImportError:  # the CPU rehearsal: longrank's side only
    torch = None

# The dense bf16 matrix rate that fractions are of: measured in `env` on this GPU (an 8192³ product on random data),
# else the H200's as the device notes give it.
GPU_BF16_FLOPS = 790e12
TOLERANCE = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}
SHAPES = {  # BERT-base for the kernel table and the training step; MiniLM-L6 for end to end
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "minilm-l6": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
}
# Other families, checked for correctness only: the tests' tiny fixtures (pack.sh carries their configurations and
# tokenizers) grown to the MiniLM-L6 shape, random weights. ModernBERT computes in f32 whatever is asked
# (model::family), so its f16 and bf16 rows check that fallback.
FAMILIES = {
    "modernbert-minilm-shape": {"fixture": "modernbert-cls", "max_position_embeddings": 512, "local_attention": 128},
    "xlm-roberta-minilm-shape": {"fixture": "xlm-roberta", "max_position_embeddings": 514},
    "electra-minilm-shape": {"fixture": "electra", "max_position_embeddings": 512, "embedding_size": 384},
    "distilbert-minilm-shape": {"fixture": "distilbert", "max_position_embeddings": 512, "hidden_dim": 1536},
    "deberta-v3-minilm-shape": {"fixture": "deberta-v3", "max_position_embeddings": 512, "pooler_hidden_size": 384},
}
# Qwen3-Reranker-0.6B's shape (random weights; the fixture's tokenizer: a vocabulary's tokens change nothing of the
# arithmetic). The directory's name tells longrank the recipe, as the hub id would.
DECODER = {
    "vocab_size": 151669,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
}
# ModernBERT-base's shape, for inputs of 8,192 tokens.
LONG = {
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "max_position_embeddings": 8192,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
}
PARTS = ["correctness", "speed", "e2e", "train", "decoder", "long"]

args = argparse.ArgumentParser()
args.add_argument("--pack", required=True)
args.add_argument("--out", required=True)
args.add_argument("--device", default="cuda")
args.add_argument("--model-dir", help="one cross-encoder for every part (else made here with transformers)")
args.add_argument("--quick", action="store_true", help="tiny sizes: the CPU rehearsal")
args.add_argument("--parts", default=",".join(PARTS), help=f"which of {PARTS} to run (env and models always)")
args = args.parse_args()

LONGRANK = os.path.join(args.pack, "longrank")
WORK = os.path.join(os.environ.get("TMPDIR", "/tmp"), "longrank-device")
QUICK = args.quick
LENGTHS = [64] if QUICK else [128, 256, 512]
BATCHES = [2, 4] if QUICK else [32, 128]
REPS = ["--warmup", "0", "--reps", "1"] if QUICK else ["--warmup", "2", "--reps", "5"]
summary = {
    "device": args.device,
    "quick": QUICK,
    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "tolerances": TOLERANCE,
    "parts": {},
    "errors": [],
}
os.makedirs(args.out, exist_ok=True)
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
log = open(os.path.join(args.out, "device.log"), "w")  # noqa: SIM115 (open for the whole run)


def write_summary() -> None:
    path = os.path.join(args.out, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(path + ".tmp", path)


REGISTERED = []  # (name, function) in the file's order, run at its end


def part(name):
    """Registers a part: run in order once every helper is defined (`run_part`)."""

    def register(f):
        REGISTERED.append((name, f))
        return f

    return register


def run_part(name, f) -> None:
    """Runs a part, records its result (or error) and seconds, and rewrites the summary."""
    if name in PARTS and name not in args.parts.split(","):
        return
    started = time.time()
    print(f"== {name}", flush=True)
    try:
        result = f()
    except Exception as e:  # noqa: BLE001 (a failed part must not stop the next)
        result = {"error": f"{type(e).__name__}: {e}"}
        summary["errors"].append(f"{name}: {e}")
        traceback.print_exc(file=log)
    result["seconds"] = round(time.time() - started, 1)
    summary["parts"][name] = result
    write_summary()
    print(json.dumps(result)[:2000], flush=True)


def longrank(*argv) -> str:
    """Runs the packed binary; its stdout (stderr to the log). Fails loudly with the end of its stderr."""
    done = subprocess.run([LONGRANK, *argv], capture_output=True, text=True, check=False)
    log.write(f"$ longrank {' '.join(argv)}\n{done.stdout}{done.stderr}\n")
    log.flush()
    if done.returncode != 0:
        raise RuntimeError(f"longrank {' '.join(argv[:3])} exited {done.returncode}: {done.stderr[-800:]}")
    return done.stdout


def results(stdout: str) -> list[dict]:
    """`RESULT key=value ...` lines as dicts (numbers parsed)."""
    rows = []
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            row = {}
            for field in line.split()[1:]:
                if "=" in field:
                    key, value = field.split("=", 1)
                    try:
                        row[key] = float(value)
                    except ValueError:
                        row[key] = value
            rows.append(row)
    return rows


def rel_error(a, b) -> float:
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    den = math.sqrt(sum(y * y for y in b)) or 1.0
    return num / den


def centered(xs):
    mean = sum(xs) / len(xs)
    return [x - mean for x in xs]


models = {}
family_models = {}  # correctness only


def pick(name: str) -> str:
    """A model by shape, or the one given."""
    return models.get(name) or models["given"]


def gpu_state() -> dict:
    """The GPU's clocks, power and temperature now (nvidia-smi), to tell a throttled run from a slow one."""
    if not args.device.startswith("cuda"):
        return {"absent": "not a GPU run"}
    fields = "name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit,"
    fields += "temperature.gpu,clocks_event_reasons.active"
    smi = shutil.which("nvidia-smi") or "/usr/local/nvidia/bin/nvidia-smi"
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30
        )
    except OSError as e:
        return {"absent": f"nvidia-smi: {e}"}
    values = done.stdout.strip().splitlines()[0].split(", ") if done.returncode == 0 else []
    if len(values) != len(fields.split(",")):
        return {"absent": f"nvidia-smi answered {done.stdout.strip()!r} {done.stderr.strip()!r}"}
    return dict(zip(fields.split(","), values))


# The libraries of a running longrank worth naming (the GPU's, or the BLAS on a CPU run), and how to ask each its
# version through ctypes: (file name part, symbol, how the answer reads).
VERSIONED = ["libcublasLt", "libcublas", "libcudart", "libcurand", "libnvrtc", "libcuda.so", "libopenblas", "libmkl_rt"]


def library_version(path: str) -> str:
    import ctypes

    lib = ctypes.CDLL(path)
    number = ctypes.c_int()
    name = os.path.basename(path)
    if name.startswith("libcublas"):
        symbol = "cublasLtGetProperty" if name.startswith("libcublasLt") else "cublasGetProperty"
        parts = []
        for kind in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            getattr(lib, symbol)(kind, ctypes.byref(number))
            parts.append(str(number.value))
        return ".".join(parts)
    if name.startswith("libnvrtc"):
        minor = ctypes.c_int()
        lib.nvrtcVersion(ctypes.byref(number), ctypes.byref(minor))
        return f"{number.value}.{minor.value}"
    for prefix, symbol in [("libcudart", "cudaRuntimeGetVersion"), ("libcuda.so", "cuDriverGetVersion")]:
        if name.startswith(prefix):
            getattr(lib, symbol)(ctypes.byref(number))
            return f"{number.value // 1000}.{number.value % 1000 // 10}"
    if name.startswith("libcurand"):
        lib.curandGetVersion(ctypes.byref(number))
        return str(number.value)
    if name.startswith("libopenblas"):
        lib.openblas_get_config.restype = ctypes.c_char_p
        return lib.openblas_get_config().decode()
    if name.startswith("libmkl_rt"):
        text = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(text, 256)
        return text.value.decode()
    return "unknown"


def loaded_libraries(pid: int) -> list[dict]:
    """The GPU and BLAS libraries a running process has mapped (not those it could have found), with versions."""
    with open(f"/proc/{pid}/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "/" in line and ".so" in line})
    found = []
    for path in paths:
        name = os.path.basename(path)
        if any(name.startswith(prefix) for prefix in VERSIONED):
            try:
                version = library_version(path)
            except Exception as e:  # noqa: BLE001 (a library that cannot say is still named)
                version = f"unknown ({type(e).__name__}: {e})"
            found.append({"path": path, "version": version})
    return found


def sync() -> None:
    """Waits for the GPU's queued work (timing device work on the host clock)."""
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


@part("env")
def env():
    found = {"longrank_bytes": os.path.getsize(LONGRANK), "ld_library_path": os.environ.get("LD_LIBRARY_PATH", "")}
    found["longrank_version"] = longrank("--version").strip()
    if torch is not None:
        found["torch"] = torch.__version__
        found["transformers"] = transformers.__version__
        if args.device.startswith("cuda"):
            found["gpu"] = torch.cuda.get_device_name(0)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    else:
        found["torch"] = "absent: longrank's side only"
    found["gpu_state"] = gpu_state()
    if torch is not None and args.device.startswith("cuda"):
        global GPU_BF16_FLOPS
        a, b = (torch.randn(8192, 8192, device=args.device, dtype=torch.bfloat16) for _ in range(2))
        for _ in range(3):
            a @ b
        sync()
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        GPU_BF16_FLOPS = 10 * 2 * 8192**3 / (time.perf_counter() - t)
        found["bf16_matmul_flops_measured"] = GPU_BF16_FLOPS
    return found


def grow(fixture: str, shape: dict, directory: str, kind):
    """The tests' fixture `fixture` (its configuration and tokenizer, in the pack) grown to `shape`, random weights,
    saved to `directory`."""
    fixture = os.path.join(args.pack, "families", fixture)
    config = transformers.AutoConfig.from_pretrained(fixture)
    for key, value in shape.items():
        setattr(config, key, value)
    n = config.num_hidden_layers
    if config.model_type == "modernbert":  # its layer kinds are listed per layer
        every = config.global_attn_every_n_layers
        config.layer_types = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(n)]
    elif getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[0]] * n
    torch.manual_seed(0)
    # Initialized on the GPU where there is one: a 0.6B model's initialization on the CPU takes a while.
    with torch.device(args.device if args.device.startswith("cuda") else "cpu"):
        model = kind.from_config(config)
    model.save_pretrained(directory)
    for file in os.listdir(fixture):
        if file.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(fixture, file), directory)
    return model


@part("models")
def make_models():
    if args.model_dir:
        models["given"] = args.model_dir
        return {"given": args.model_dir}
    if torch is None:
        raise RuntimeError("no --model-dir and no transformers to make models with")
    made = {}
    for name, shape in SHAPES.items():
        directory = os.path.join(WORK, name)
        config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, num_labels=1, **shape)
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(config)
        model.save_pretrained(directory)
        for file in os.listdir(os.path.join(args.pack, "vocab")):
            shutil.copy(os.path.join(args.pack, "vocab", file), directory)
        models[name] = directory
        made[name] = {**shape, "parameters": sum(p.numel() for p in model.parameters())}
    for name, grown in FAMILIES.items():
        shape = {key: value for key, value in {**SHAPES["minilm-l6"], **grown}.items() if key != "fixture"}
        directory = os.path.join(WORK, name)
        model = grow(grown["fixture"], shape, directory, transformers.AutoModelForSequenceClassification)
        family_models[name] = directory
        made[name] = {"model_type": model.config.model_type, "parameters": sum(p.numel() for p in model.parameters())}
    return made


def torch_model(directory, dtype):
    """transformers' classifier in `dtype`, through sdpa where the family has it (DeBERTa has not)."""
    load = transformers.AutoModelForSequenceClassification.from_pretrained
    try:
        model = load(directory, dtype=dtype, attn_implementation="sdpa")
    except ValueError:
        model = load(directory, dtype=dtype, attn_implementation="eager")
    return model.to(args.device).eval()


def torch_logits(model, ids, type_ids):
    n = max(len(x) for x in ids)
    pad = lambda rows: torch.tensor([r + [0] * (n - len(r)) for r in rows], device=args.device)
    mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in ids], device=args.device)
    # ModernBERT takes no token types.
    types = {"token_type_ids": pad(type_ids)} if "token_type_ids" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        # Two labels: label 1 is the score, as longrank reads it (model::head).
        out = model(input_ids=pad(ids), attention_mask=mask, **types).logits[:, -1]
    return out.float().cpu().tolist()


def family_check(directory, device, dtype, length, path) -> dict:
    """`bench model --check` at `length`: the check batch's word pieces and longrank's scores."""
    longrank(
        "bench",
        "model",
        "--dir",
        directory,
        "--device",
        device,
        "--dtype",
        dtype,
        "--lengths",
        str(length),
        "--batches",
        "1",
        "--warmup",
        "0",
        "--reps",
        "1",
        "--check",
        path,
    )
    with open(path) as f:
        return json.load(f)


@part("correctness")
def correctness():
    found = {}
    for name, directory in {**models, **family_models}.items():
        try:
            found[name] = check_model(name, directory)
        except Exception as e:  # noqa: BLE001 (one family's failure must not hide the others')
            found[name] = {"error": f"{type(e).__name__}: {e}"}
            summary["errors"].append(f"correctness of {name}: {e}")
            traceback.print_exc(file=log)
    return found


def check_model(name, directory) -> dict:
    """One model's check batch through longrank on the CPU and the device in each dtype, and transformers."""
    checks = {}
    for device, dtype in [("cpu", "f32"), (args.device, "f32"), (args.device, "f16"), (args.device, "bf16")]:
        key = f"{device}-{dtype}"
        if key in checks or (device == "cpu" and args.device == "cpu" and dtype != "f32"):
            continue
        checks[key] = family_check(directory, device, dtype, LENGTHS[0], os.path.join(WORK, f"check-{name}-{key}.json"))
    cpu = checks["cpu-f32"]
    row = {"pairs": len(cpu["scores"]), "length": cpu["length"], "pair_lengths": [len(x) for x in cpu["ids"]]}
    for key, check in checks.items():
        assert check["ids"] == cpu["ids"], "the inputs differ between runs"
        row[f"longrank_{key}_vs_cpu_f32"] = rel_error(check["scores"], cpu["scores"])
    if torch is not None:
        reference = torch_logits(torch_model(directory, torch.float32), cpu["ids"], cpu["type_ids"])
        row["torch_f32_vs_longrank_cpu_f32"] = rel_error(cpu["scores"], reference)
        for dtype, torch_dtype in [("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)]:
            ours = checks.get(f"{args.device}-{dtype}")
            if ours is None:
                continue
            theirs = torch_logits(torch_model(directory, torch_dtype), cpu["ids"], cpu["type_ids"])
            error = rel_error(ours["scores"], reference)
            row[f"longrank_{dtype}_vs_torch_f32"] = error
            row[f"torch_{dtype}_vs_torch_f32"] = rel_error(theirs, reference)
            row[f"longrank_{dtype}_vs_torch_f32_centered"] = rel_error(centered(ours["scores"]), centered(reference))
            row[f"within_tolerance_{dtype}"] = error <= TOLERANCE[dtype]
    row["within_tolerance_cpu"] = row[f"longrank_{args.device}-f32_vs_cpu_f32"] <= TOLERANCE["f32"]
    return row


def torch_speed(directory, dtype, length, batch, warmup, reps):
    model = torch_model(directory, dtype)
    ids = torch.randint(1000, 30000, (batch, length), device=args.device)
    ids[:, 0] = 101
    return batch / torch_seconds(lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids)), warmup, reps)


def torch_seconds(forward, warmup, reps) -> float:
    """The median seconds of `forward()` without gradients, the GPU's queue drained around each."""
    times = []
    with torch.no_grad():
        for i in range(warmup + reps):
            sync()
            t = time.perf_counter()
            forward()
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t)
    return statistics.median(times)


@part("speed")
def speed():
    table = []
    dtypes = ["f32"] if args.device == "cpu" else ["bf16", "f16"]
    for name in models:
        for dtype in dtypes:
            out = longrank(
                "bench",
                "model",
                "--dir",
                pick(name),
                "--device",
                args.device,
                "--dtype",
                dtype,
                "--lengths",
                ",".join(map(str, LENGTHS)),
                "--batches",
                ",".join(map(str, BATCHES)),
                *REPS,
            )
            for r in results(out):
                row = {
                    "model": name,
                    "dtype": dtype,
                    "length": int(r["len"]),
                    "batch": int(r["batch"]),
                    "longrank_pairs_per_s": r["pairs_per_s_med"],
                    "longrank_fraction_of_bf16_limit": r["gflops_med"] * 1e9 / GPU_BF16_FLOPS,
                }
                pair_flops = r["gflops_med"] * 1e9 / r["pairs_per_s_med"]
                if torch is not None:
                    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
                    theirs = torch_speed(
                        pick(name), torch_dtype, row["length"], row["batch"], *(0, 1) if QUICK else (2, 5)
                    )
                    row["torch_pairs_per_s"] = theirs
                    row["torch_fraction_of_bf16_limit"] = theirs * pair_flops / GPU_BF16_FLOPS
                    row["longrank_over_torch"] = row["longrank_pairs_per_s"] / theirs
                table.append(row)
                summary["parts"]["speed"] = {"table": table, "partial": True}
                write_summary()
    return {"table": table, "gpu_state_after": gpu_state()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.read().decode()


@part("e2e")
def end_to_end():
    data = os.path.join(WORK, "data")
    source = os.path.join(WORK, "synth")
    docs, topics = (60, 8) if QUICK else (3000, 100)
    subprocess.run([sys.executable, os.path.join(args.pack, "synth.py"), source, str(docs), str(topics)], check=True)
    longrank("--data-dir", data, "index", "--collection", "synth", os.path.join(source, "docs.jsonl"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    depth = 10 if QUICK else 100
    env = {
        "LONGRANK_MODEL_DEVICE": args.device,
        "LONGRANK_MODEL_DTYPE": "f32" if args.device == "cpu" else "bf16",
        "LONGRANK_SERVER_REQUEST_TIMEOUT_MS": "600000",
        # A GPU's forward pass wants more than the CPU default of 8,192 padded tokens (32 pairs of 256).
        "LONGRANK_MODEL_MAX_BATCH_TOKENS": "8192" if args.device == "cpu" else "65536",
        "LONGRANK_LIMITS_MAX_DEPTH": "1000",
    }
    server_log = open(os.path.join(args.out, "server.log"), "w")  # noqa: SIM115 (the server writes it until it stops)
    server = subprocess.Popen(
        [LONGRANK, "--data-dir", data, "--model", pick("minilm-l6"), "serve", "--addr", f"127.0.0.1:{port}"],
        stdout=server_log,
        stderr=server_log,
        env={**os.environ, **env},
    )
    try:
        for _ in range(600):
            try:
                call(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        found = {"documents": docs, "depth": depth, "settings": env}

        def search(query):
            t = time.perf_counter()
            body = {"query": query, "pipeline": "maxp", "depth": depth, "k": 10, "collection": "synth"}
            answer = json.loads(call(base + "/search", body))
            return time.perf_counter() - t, answer["timing"]["pairs"]

        search("warm up the model")
        found["libraries"] = loaded_libraries(server.pid)
        with open(os.path.join(source, "search-topics.tsv")) as f:
            queries = [line.rstrip("\n").split("\t", 1)[1] for line in f]
        latencies, pairs = zip(*(search(q) for q in queries))
        ordered = sorted(latencies)
        found["search"] = {
            "requests": len(ordered),
            "p50_ms": 1e3 * statistics.median(ordered),
            "p99_ms": 1e3 * ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
            "pairs_per_request": statistics.mean(pairs),
        }
        summary["parts"]["e2e"] = {**found, "partial": True}
        write_summary()

        def pairs_total():
            metrics = call(base + "/metrics")
            return sum(
                float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("longrank_model_pairs_total")
            )

        with open(os.path.join(source, "batch-topics.tsv")) as f:
            batch_topics = f.read()
        before, t = pairs_total(), time.perf_counter()
        body = {"topics": batch_topics, "pipeline": "maxp", "depth": depth, "k": depth, "collection": "synth"}
        job = json.loads(call(base + "/batch?wait=true", body))
        # Not finished within the server's patience (202): followed until it is.
        while job["status"] in ("queued", "running"):
            time.sleep(0.5)
            job = json.loads(call(f"{base}/batch/{job['id']}"))
        wall = time.perf_counter() - t
        computed = pairs_total() - before
        found["batch"] = {
            "status": job["status"],
            "topics": batch_topics.count("\n"),
            "seconds": wall,
            "pairs": computed,
            "pairs_per_s": computed / wall,
        }
        return found
    finally:
        server.terminate()
        server.wait(timeout=30)


@part("train")
def train():
    name = "bert-base"
    length, batch = (32, 4) if QUICK else (256, 16)
    steps = ["--warmup", "0", "--steps", "1"] if QUICK else ["--warmup", "1", "--steps", "4"]
    out = longrank(
        "bench",
        "train",
        "--dir",
        pick(name),
        "--device",
        args.device,
        "--length",
        str(length),
        "--batch",
        str(batch),
        *steps,
    )
    found = {"model": name, "length": length, "batch": batch, "longrank_step_s": results(out)[0]["med"]}
    if torch is not None:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(pick(name)).to(args.device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
        ids = torch.randint(1000, 30000, (batch, length), device=args.device)
        times = []
        for step in range(2 if QUICK else 5):
            sync()
            t = time.perf_counter()
            scores = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, 0]
            half = batch // 2
            loss = torch.relu(1.0 + scores[half:] - scores[:half]).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            sync()
            if step >= 1:
                times.append(time.perf_counter() - t)
        found["torch_step_s"] = statistics.median(times)
        found["longrank_over_torch_time"] = found["longrank_step_s"] / found["torch_step_s"]
    return found


def decoder_scores(model, ids: list[list[int]], yes: int, no: int) -> list[float]:
    """The Qwen3-Reranker card's score before its softmax: the last position's yes logit less its no logit, one
    pair at a time (no padding to get wrong)."""
    scores = []
    with torch.no_grad():
        for row in ids:
            logits = model(input_ids=torch.tensor([row], device=args.device)).logits[0, -1].float()
            scores.append((logits[yes] - logits[no]).item())
    return scores


def torch_decoder_speed(model, length, batch, warmup, reps):
    """transformers' causal LM over full batches, the last position's logits only where it can (`logits_to_keep`),
    as a serving peer computes them."""
    ids = torch.randint(10, 600, (batch, length), device=args.device)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    return batch / torch_seconds(lambda: model(input_ids=ids, **keep), warmup, reps)


def bench_once(directory, dtype, length, batch) -> dict:
    """`bench model`'s result row for one length and batch on the device, three timed passes."""
    out = longrank("bench", "model", "--dir", directory, "--device", args.device, "--dtype", dtype,
                   "--lengths", str(length), "--batches", str(batch), *REPS[:2], "--reps", "3")  # fmt: skip
    return results(out)[0]


@part("decoder")
def decoder():
    """A Qwen3-Reranker of the 0.6B's shape in bf16 (and f32) on the GPU against transformers' causal LM on the
    same inputs; pairs/s of both. Without PyTorch (the rehearsal) the fixture itself, longrank's side only."""
    if torch is None:
        directory = os.path.join(args.pack, "families", "qwen3-reranker")
    else:
        directory = os.path.join(WORK, "qwen3-reranker-0.6b-shape")
        grow("qwen3-reranker", DECODER, directory, transformers.AutoModelForCausalLM)
    length = 512  # the card's instruction and labels take about 100 tokens
    dtypes = ["f32"] if args.device == "cpu" else ["f32", "bf16"]
    checks = {
        dtype: family_check(directory, args.device, dtype, length, os.path.join(WORK, f"decoder-{dtype}.json"))
        for dtype in dtypes
    }
    ids = checks["f32"]["ids"]
    found = {"model": directory, "length": length, "pair_lengths": [len(x) for x in ids]}
    for dtype, check in checks.items():
        assert check["ids"] == ids, "the inputs differ between dtypes"
    speed_rows = []
    if torch is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
        reference = None
        for dtype, torch_dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
            model = (
                transformers.AutoModelForCausalLM.from_pretrained(
                    directory, dtype=torch_dtype, attn_implementation="sdpa"
                )
                .to(args.device)
                .eval()
            )
            theirs = decoder_scores(model, ids, yes, no)
            reference = reference or theirs
            found[f"torch_{dtype}_vs_torch_f32"] = rel_error(theirs, reference)
            if dtype in checks:
                found[f"longrank_{dtype}_vs_torch_f32"] = rel_error(checks[dtype]["scores"], reference)
                found[f"within_tolerance_{dtype}"] = found[f"longrank_{dtype}_vs_torch_f32"] <= TOLERANCE[dtype]
            if dtype == "bf16" and not QUICK:
                for length_, batch in [(512, 8), (512, 32), (1024, 16)]:
                    speed_rows.append(
                        {
                            "length": length_,
                            "batch": batch,
                            "torch_pairs_per_s": torch_decoder_speed(model, length_, batch, 1, 3),
                        }
                    )
            del model
            torch.cuda.empty_cache()
    else:
        found["longrank_f32_scores"] = checks["f32"]["scores"]
    speed_dtype = "f32" if args.device == "cpu" else "bf16"
    # Without PyTorch's rows (the rehearsal, a CPU run), one small row of longrank's own.
    rows = speed_rows or [{"length": length, "batch": 2}]
    for row in rows:
        r = bench_once(directory, speed_dtype, row["length"], row["batch"])
        row["longrank_pairs_per_s"] = r["pairs_per_s_med"]
        row["longrank_fraction_of_bf16_limit"] = r["gflops_med"] * 1e9 / GPU_BF16_FLOPS
        if "torch_pairs_per_s" in row:
            row["longrank_over_torch"] = row["longrank_pairs_per_s"] / row["torch_pairs_per_s"]
    found["speed"] = rows
    return found


@part("long")
def long_inputs():
    """ModernBERT-base's shape at 8,192 tokens: longrank (which computes ModernBERT in f32 whatever is asked) beside
    transformers in f32 and bf16 (sdpa), and the check batch against transformers' f32."""
    length = 64 if QUICK else 8192
    if torch is None:
        directory = os.path.join(args.pack, "families", "modernbert-cls")
    else:
        directory = os.path.join(WORK, "modernbert-base-shape")
        grow("modernbert-cls", LONG, directory, transformers.AutoModelForSequenceClassification)
    check = family_check(directory, args.device, "f32", min(length, 512), os.path.join(WORK, "long.json"))
    found = {"length": length, "check_length": check["length"]}
    if torch is not None:
        reference = torch_logits(torch_model(directory, torch.float32), check["ids"], check["type_ids"])
        found["longrank_f32_vs_torch_f32"] = rel_error(check["scores"], reference)
        found["within_tolerance_f32"] = found["longrank_f32_vs_torch_f32"] <= TOLERANCE["f32"]
    rows = []
    for batch in [1] if QUICK else [1, 4]:
        r = bench_once(directory, "f32", length, batch)
        row = {"batch": batch, "longrank_f32_pairs_per_s": r["pairs_per_s_med"]}
        if torch is not None:
            for dtype, torch_dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
                row[f"torch_{dtype}_pairs_per_s"] = torch_speed(directory, torch_dtype, length, batch, 1, 3)
            row["longrank_over_torch_bf16"] = row["longrank_f32_pairs_per_s"] / row["torch_bf16_pairs_per_s"]
        rows.append(row)
    found["speed"] = rows
    return found


for name, f in REGISTERED:
    run_part(name, f)
summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
write_summary()
print(json.dumps({"errors": summary["errors"]}))
sys.exit(1 if summary["errors"] else 0)
