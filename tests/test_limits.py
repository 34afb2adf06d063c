"""The size limits and the machine's budget: every size bounded, parameter counts from a config
alone equal the built model's, one memory rule."""

import os
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise import limits
from headwise.models import LMConfig, TransformerConfig, build


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["lm", "transformer"]), heads=st.integers(1, 4),
       head_dim=st.integers(1, 8), layers=st.integers(1, 3), d_ff=st.integers(1, 40),
       vocab=st.integers(4, 50), tie=st.booleans(),
       positional=st.sampled_from(["sinusoidal", "learned"]), kv=st.booleans(),
       pre=st.booleans())
def test_parameter_count_equals_the_built_model(kind, heads, head_dim, layers, d_ff, vocab, tie,
                                                positional, kv, pre):
    common = dict(d_model=heads * head_dim, num_heads=heads, num_layers=layers, d_ff=d_ff,
                  max_len=12, tie_embeddings=tie, positional=positional,
                  num_kv_heads=1 if kv else None, dropout=0.0, norm_first=pre)
    cfg = (LMConfig(vocab_size=vocab, **common) if kind == "lm"
           else TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab + 1, **common))
    model = build(cfg)
    real = len(torch.nn.utils.parameters_to_vector(model.parameters()))
    assert limits.parameter_count(kind, cfg.to_dict()) == real


def test_absurd_sizes_are_counted_at_once_and_refused_with_the_number():
    start = time.perf_counter()
    n = limits.parameter_count("lm", dict(vocab_size=100, d_model=1_000_000, num_heads=1,
                                           num_layers=1_000_000, d_ff=4_000_000))
    assert n > 10**18 and time.perf_counter() - start < 0.1
    with pytest.raises(ValueError, match=r"^here: a model would need about [\d,.]+ GB of memory, "
                       r"more than this machine's [\d,.]+ GB; use smaller sizes$"):
        limits.check_memory(4 * n, "a model", "here", "use smaller sizes")
    limits.check_memory(limits.machine_memory(), "all of it", "here")  # at the limit: accepted
    assert 1 <= limits.cpu_count() <= (os.cpu_count() or 1) and limits.machine_memory() > 2**20


@settings(max_examples=50, deadline=None)
@given(kind=st.sampled_from(sorted(limits.MAX)), value=st.integers(-5, 2**22), low=st.integers(0, 2))
def test_size_accepts_exactly_low_to_the_maximum(kind, value, low):
    top = limits.MAX[kind]
    if low <= value <= top:
        assert limits.size(value, "n", kind, "f", low=low) == value
    else:
        with pytest.raises(ValueError, match="^f: n" + ("=" if value > top else " must be >=")):
            limits.size(value, "n", kind, "f", low=low)


@pytest.mark.parametrize("value", [2.0, "3", True, None])
def test_size_wants_an_int(value):
    with pytest.raises(TypeError, match="f: n must be an int"):
        limits.size(value, "n", "dim", "f")


@given(n=st.integers(0, 2**60))
def test_format_bytes_reads_back_within_its_rounding(n):
    """Every size prints as a number that reads back to within its rounding."""
    number, unit = limits.format_bytes(n).split()
    scale = 1024 ** ["B", "KiB", "MiB", "GiB", "TiB", "PiB"].index(unit)
    # half a unit of the last digit, exactly at a tie (12032 B = 11.75 KiB -> "11.8"), plus the
    # float64 error of reading "11.8" back (11.8 * 1024 = 12083.2000000000007)
    assert abs(float(number.replace(",", "")) * scale - n) <= 0.05 * scale + 1e-12 * max(n, scale)
    assert unit == "B" or float(number.replace(",", "")) >= 1.0


def test_format_bytes_at_a_rounding_tie_reads_back():
    """12032 B is 11.75 KiB exactly: printed "11.8 KiB", half a digit away (a hypothesis draw
    found the tie)."""
    assert limits.format_bytes(12032) == "11.8 KiB"
    test_format_bytes_reads_back_within_its_rounding.hypothesis.inner_test(12032)


@given(value=st.one_of(st.integers(-5, 10**6), st.booleans(), st.floats(0, 8), st.none()))
def test_a_thread_count_is_an_int_between_one_and_the_cpus(value):
    """One rule for --threads (chat, heads prune) and TrainConfig.threads: chat took 100,000
    threads, which under a memory limit failed mid-load as a 'truncated model file'."""
    cpus = limits.cpu_count()
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= cpus:
        assert limits.threads(value, "--threads") == value
    else:
        with pytest.raises(ValueError, match=rf"--threads must be an int in \[1, {cpus}\] "
                                             r"\(this machine's CPUs\); got"):
            limits.threads(value, "--threads")



@settings(max_examples=50, deadline=None)
@given(user=st.dictionaries(st.sampled_from(["OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS",
                                             "PATH"]),
                            st.sampled_from(["ACTIVE", "passive", "300000", "0", "/usr/bin"]),
                            max_size=3),
       torch_loaded=st.booleans(), others=st.one_of(st.none(), st.integers(0, 64)))
def test_the_wait_policy_is_passive_unless_the_user_chose_or_torch_is_loaded(user, torch_loaded,
                                                                               others):
    env = dict(user)
    got = limits.wait_policy(env, torch_loaded=torch_loaded, others=others)
    if "OMP_WAIT_POLICY" in user or "GOMP_SPINCOUNT" in user:
        assert (got, env) == ("user", user)  # their choice stands, untouched
    elif torch_loaded:
        assert (got, env) == ("late", user)  # libgomp read its settings already: claim nothing
    elif others == 0:
        assert (got, env) == ("quiet", user)  # nothing else running: the spin is the fast choice
    else:  # another process runs, or we cannot tell: sleep, don't spin
        assert (got, env) == ("set", dict(user, OMP_WAIT_POLICY="PASSIVE"))


def test_others_running_counts_a_busy_loop():
    import subprocess
    import sys
    import time
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        seen = max(limits.others_running() or 0 for _ in range(20))
    finally:
        for p in loops:
            p.kill()
            p.wait()
    if limits.others_running() is not None:  # Linux
        assert seen >= 1


@pytest.mark.parametrize(("first", "user", "policy"), [
    ("import headwise; import torch", {}, "PASSIVE"),
    ("import headwise.cli; import torch", {}, "PASSIVE"),  # the CLI's entry point
    ("import headwise; import torch", {"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),
    ("import headwise; import torch", {"GOMP_SPINCOUNT": "300000"}, None),
    ("import torch; import headwise", {}, None),
])
def test_importing_headwise_before_torch_sets_the_policy_libgomp_reads(first, user, policy):
    """In a fresh interpreter beside a busy loop on each CPU: what OMP_WAIT_POLICY is when
    torch (and so libgomp) loads."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in limits.WAIT_SETTINGS}
    code = f"{first}; import os; print(os.environ.get('OMP_WAIT_POLICY'))"
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(limits.cpu_count())]
    try:
        out = subprocess.run([sys.executable, "-c", code], env=dict(env, **user), text=True,
                             capture_output=True, timeout=120, check=True).stdout.split()[-1]
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert out == str(policy)


def test_cpu_model_names_this_cpu():
    name = limits.cpu_model()
    assert name and name == name.strip() and "\n" not in name
    try:
        with open("/proc/cpuinfo") as f:
            listed = [" ".join(line.split(":", 1)[1].split()) for line in f
                      if line.startswith("model name")]
    except OSError:
        listed = []
    if listed:
        assert name == listed[0]


@given(cpus=st.integers(1, 256), others=st.one_of(st.none(), st.integers(0, 512)))
def test_free_threads_leaves_the_cpus_others_use(cpus, others):
    from unittest import mock
    with mock.patch.object(limits, "others_running", return_value=others), \
            mock.patch.object(limits, "cpu_count", return_value=cpus):
        got = limits.free_threads()
    assert got == (None if not others else max(1, cpus - others))
