// test_step01_matmul.c — step01's claims: the accounting formulas reproduce published
// parameter counts and hand-computed KV/FLOP numbers for MHA, GQA, tied and biased configs;
// config.json parsing accepts both rope spellings and refuses what the engine lacks.
// (The matmul ladders' tests: test_step01_matmul_cpu.c and test_step01_matmul_gpu.c.)
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "step01_matmul/accounting.h"
#include "hf_config.h"

static ModelConfig load_cfg(const char *path) {
    ModelConfig c;
    char err[512];
    int rc = hf_config_load(path, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "loading %s failed: %s", path, err);
    return c;
}

static ModelConfig preset(const char *name) {
    ModelConfig c;
    char err[512];
    const char *js = preset_config_json(name);
    cr_assert_not_null(js, "no preset %s", name);
    cr_assert_eq(hf_config_parse(js, name, &c, err, sizeof err), 0, "%s", err);
    return c;
}

// Published totals (model cards / safetensors metadata).
Test(step01, account_reproduces_published_parameter_counts) {
    struct { const char *name; long long params; } pub[] = {
        {"llama-2-7b", 6738415616LL},   {"llama-3.1-8b", 8030261248LL},    {"tinyllama-1.1b", 1100048384LL},
        {"qwen2.5-0.5b", 494032768LL},  {"mistral-7b-v0.3", 7248023552LL},
    };
    for (size_t i = 0; i < sizeof pub / sizeof pub[0]; i++) {
        ModelConfig c = preset(pub[i].name);
        ParamCount p = account_params(&c);
        cr_expect_eq(p.total, pub[i].params, "%s: %lld params, published %lld", pub[i].name, (long long)p.total,
                     pub[i].params);
    }
}

Test(step01, account_kv_bytes_per_token_published) {
    ModelConfig c = preset("llama-2-7b");
    MemUsage m = account_memory(&c, 1, 1, 2, 2, 2);
    cr_assert_eq(m.kv_per_token, 512.0 * 1024, "Llama-2-7B fp16 KV must be 0.5 MiB/token, got %g", m.kv_per_token);
    c = preset("llama-3.1-8b");
    m = account_memory(&c, 1, 1, 2, 2, 2);
    cr_assert_eq(m.kv_per_token, 128.0 * 1024, "Llama-3.1-8B bf16 KV (GQA, 8 kv heads) must be 128 KiB/token");
}

// Hand-computed expectations for the test configs (the arithmetic is in the comments).
Test(step01, account_mha_untied_by_hand) {
    ModelConfig c = load_cfg("tests/data/configs/llama_mha_tiny.json");
    cr_assert_eq(c.head_dim, 16);
    ParamCount p = account_params(&c);
    cr_expect_eq(p.embedding, 64000);  // 1000 x 64
    cr_expect_eq(p.q, 3 * 4096);       // 3 layers x 64 x 64
    cr_expect_eq(p.mlp, 3 * 33024);    // 3 x (3 x 64 x 172)
    cr_expect_eq(p.norms, 3 * 128 + 64);
    cr_expect_eq(p.lm_head, 64000);
    cr_expect_eq(p.total, 276672);  // 64000 + 3 x 49536 + 64 + 64000
    MemUsage m = account_memory(&c, 1, 10, 4, 4, 4);
    cr_expect_eq(m.kv_per_token, 1536.0);  // 2 x 3 x 4 x 16 x 4 B
    Flops f = account_flops(&c, 10);
    cr_expect_eq(f.weights_per_token, 424448.0);       // 2 x (3 x 49408 + 64000)
    cr_expect_eq(f.attn_per_token_per_ctx, 768.0);     // 4 x 3 x 4 x 16
    cr_expect_eq(f.decode_per_token, 424448.0 + 7680.0);
    cr_expect_eq(f.prefill_total, 424448.0 * 10 + 768.0 * 55);  // causal: 1+2+...+10 = 55
}

Test(step01, account_gqa_tied_explicit_head_dim_by_hand) {
    ModelConfig c = load_cfg("tests/data/configs/llama3_gqa_tied_v5.json");
    cr_assert_eq(c.head_dim, 24, "explicit head_dim (not 96/6 = 16) must be used");
    cr_assert(c.tie_embeddings);
    ParamCount p = account_params(&c);
    cr_expect_eq(p.q, 2 * 13824);  // 96 x (6 x 24)
    cr_expect_eq(p.k, 2 * 4608);   // 96 x (2 x 24)
    cr_expect_eq(p.lm_head, 0, "tied lm_head is counted once, in the embedding");
    cr_expect_eq(p.total, 264000);  // 74592 + 2 x 94656 + 96
    Flops f = account_flops(&c, 1);
    // lm_head still multiplies every token when tied: 2 x (2 x 94464 + 74592)
    cr_expect_eq(f.weights_per_token, 2.0 * (2 * 94464 + 74592));
    MemUsage m = account_memory(&c, 1, 1, 2, 2, 2);
    cr_expect_eq(m.kv_per_token, 384.0);  // 2 x 2 layers x 2 kv heads x 24 x 2 B
    // GQA saves n_heads / n_kv_heads = 3x over the same model with MHA
    ModelConfig mha = c;
    mha.n_kv_heads = mha.n_heads;
    cr_expect_eq(account_memory(&mha, 1, 1, 2, 2, 2).kv_per_token, 3 * 384.0);
}

Test(step01, account_qwen2_bias_by_hand) {
    ModelConfig c = load_cfg("tests/data/configs/qwen2_bias.json");
    cr_assert(c.qkv_bias && !c.o_bias);
    ParamCount p = account_params(&c);
    cr_expect_eq(p.q, 2 * 3192);  // 56 x 56 + 56 bias
    cr_expect_eq(p.k, 2 * 456);   // 56 x 8 + 8 bias (MQA: 1 kv head)
    cr_expect_eq(p.o, 2 * 3136);  // no o bias
    cr_expect_eq(p.total, 93160);
    cr_expect_eq(account_memory(&c, 1, 1, 2, 2, 2).kv_per_token, 64.0);
}

Test(step01, account_qwen3_qk_norm_by_hand) {
    ModelConfig c = load_cfg("tests/data/configs/qwen3_qknorm.json");
    cr_assert(c.qk_norm && c.head_dim == 32);
    ParamCount p = account_params(&c);
    cr_expect_eq(p.norms, 3 * (128 + 64) + 64);  // 2 RMSNorms + q_norm + k_norm (32 each) per layer
    cr_expect_eq(p.total, 186496);
}

Test(step01, config_rope_both_spellings) {
    ModelConfig a = load_cfg("tests/data/configs/llama3_gqa_tied_v5.json");
    cr_expect_eq(a.rope_type, ROPE_LLAMA3);
    cr_expect_float_eq(a.rope_theta, 500000.0, 1e-9);
    cr_expect_float_eq(a.rope_factor, 32.0, 1e-9);
    cr_expect_eq(a.rope_original_max_pos, 128);
    cr_expect_eq(a.n_eos, 3);
    cr_expect_str_eq(a.torch_dtype, "bfloat16");
    ModelConfig b = preset("llama-3.1-8b");  // old spelling: top-level rope_theta + rope_scaling
    cr_expect_eq(b.rope_type, ROPE_LLAMA3);
    cr_expect_float_eq(b.rope_theta, 500000.0, 1e-9);
    cr_expect_float_eq(b.rope_factor, 8.0, 1e-9);
    ModelConfig m = load_cfg("tests/data/configs/llama_mha_tiny.json");
    cr_expect_eq(m.rope_type, ROPE_DEFAULT);
    cr_expect_float_eq(m.rope_theta, 10000.0, 1e-9);
}

static void expect_refused(const char *json, const char *needle) {
    ModelConfig c;
    char err[512] = "";
    cr_expect_eq(hf_config_parse(json, "t", &c, err, sizeof err), -1, "must refuse: %s", json);
    cr_expect(strstr(err, needle) != NULL, "message '%s' should mention '%s'", err, needle);
}

Test(step01, config_refuses_what_is_not_implemented) {
#define BASE "\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100"
    expect_refused("{\"architectures\":[\"GPT2LMHeadModel\"]," BASE "}", "GPT2LMHeadModel");
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"]," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", "yarn");
    expect_refused("{\"architectures\":[\"MistralForCausalLM\"]," BASE ",\"max_position_embeddings\":32768,\"sliding_window\":4096}", "sliding_window");
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100}", "hidden_size");
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"]," BASE ",\"num_key_value_heads\":3}", "num_key_value_heads");
    expect_refused("{\"architectures\": [", "invalid JSON");
    expect_refused("[1,2]", "object");
    ModelConfig c;
    char err[512];
    cr_expect_eq(hf_config_load("tests/data/configs/does_not_exist.json", &c, err, sizeof err), -1);
    cr_expect(strstr(err, "does_not_exist.json"), "the message must name the file: %s", err);
}

// The program itself: --json carries the documented keys with the published values.
static json_t *run_json(const char *args) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/account %s --json", BUILD_BIN_DIR, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    int rc = pclose(p);
    cr_assert_eq(rc, 0, "%s exited with %d", cmd, rc);
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    cr_assert_not_null(j, "%s: not JSON: %s", cmd, e.text);
    return j;
}

Test(step01, account_cli_json) {
    json_t *j = run_json("--preset llama-2-7b --context 4096");
    cr_expect_eq(json_integer_value(json_object_get(j, "params_total")), 6738415616LL);
    cr_expect_eq(json_integer_value(json_object_get(j, "params_embedding")), 131072000LL);
    cr_expect_float_eq(json_number_value(json_object_get(j, "kv_cache_bytes_per_token")), 524288.0, 1e-9);
    cr_expect_float_eq(json_number_value(json_object_get(j, "weights_bytes")), 6738415616.0 * 2, 1);
    cr_expect(json_number_value(json_object_get(j, "flops_per_token_decode")) > 2 * 6.6e9);
    json_decref(j);
    j = run_json("--config tests/data/configs/llama3_gqa_tied_v5.json --dtype fp32");
    cr_expect_eq(json_integer_value(json_object_get(j, "params_total")), 264000);
    cr_expect_float_eq(json_number_value(json_object_get(j, "weights_bytes")), 264000.0 * 4, 1e-6);
    json_decref(j);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/account --preset no-such-model >/dev/null 2>&1", BUILD_BIN_DIR);
    cr_expect_neq(system(cmd), 0, "an unknown preset must fail");
}

// Decode bytes by hand: Llama-3.1-8B bf16 (untied): every parameter but the 128256 x 4096
// embedding table, plus the one row a token looks up; KV 4096 positions x 128 KiB.
// Llama-3.2-1B (tied): the table is the lm_head, read whole.
Test(step01, decode_step_bytes_by_hand) {
    ModelConfig c = preset("llama-3.1-8b");
    DecodeStep d = account_decode_step(&c, 1, 4096, 2, 2);
    cr_expect_float_eq(d.weights, (8030261248.0 - 128256.0 * 4096 + 4096) * 2, 1e-3);
    cr_expect_float_eq(d.kv, 4096.0 * 131072, 1e-3);
    cr_expect_float_eq(d.bytes, d.weights + d.kv, 1e-3);
    d = account_decode_step(&c, 16, 100, 2, 2);  // 16 rows of the table, 16 caches
    cr_expect_float_eq(d.weights, (8030261248.0 - 128256.0 * 4096 + 16 * 4096) * 2, 1e-3);
    cr_expect_float_eq(d.kv, 16.0 * 100 * 131072, 1e-3);
    ModelConfig t = preset("llama-3.2-1b");
    cr_expect_float_eq(account_decode_step(&t, 1, 1, 2, 2).weights, (double)account_params(&t).total * 2, 1e-3);
}

// account's JSON and text give one answer: at --batch 16 the prefill total is 16 sequences'
// FLOPs in both, and the decode ceiling is batch / max(FLOPs / peak, bytes / bandwidth) with the
// bytes of account_decode_step.
Test(step01, account_json_batch_totals_and_roofline) {
    json_t *j = run_json("--preset llama-3.1-8b --batch 16 --context 1024 --peak-tflops 100 --peak-gbps 1000");
    const double per_seq = json_number_value(json_object_get(j, "flops_prefill_per_sequence"));
    cr_expect_float_eq(json_number_value(json_object_get(j, "flops_prefill_total")), 16 * per_seq, 16 * per_seq * 1e-10);
    ModelConfig c = preset("llama-3.1-8b");
    const DecodeStep d = account_decode_step(&c, 16, 1024, 2, 2);
    cr_expect_float_eq(json_number_value(json_object_get(j, "decode_bytes_read")), d.bytes, d.bytes * 1e-10);
    const double floor_s = fmax(d.flops / 100e12, d.bytes / 1000e9);
    cr_expect_float_eq(json_number_value(json_object_get(j, "decode_tokens_per_s_ceiling")), 16 / floor_s, 16 / floor_s * 1e-10);
    json_decref(j);
    char cmd[512];  // the text table prints the same whole-batch prefill total
    snprintf(cmd, sizeof cmd, "%s/account --preset llama-3.1-8b --batch 16 --context 1024 --csv", BUILD_BIN_DIR);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512];
    double text_total = NAN;
    while (fgets(line, sizeof line, p))
        if (!strncmp(line, "flops,\"prefill, whole prompt\",", 30) || !strncmp(line, "flops,prefill, whole prompt,", 28))
            text_total = atof(strchr(line + 25, ',') + 1);
    pclose(p);
    cr_expect_float_eq(text_total, 16 * per_seq, 16 * per_seq * 1e-8, "text prefill total %g, json %g", text_total,
                       16 * per_seq);
}

// A ceilings file from a GPU without bf16 tensor cores (a T4: bf16 0) gives account the fp16
// ceiling for bf16 weights, and says so; the file is found from any working directory.
Test(step01, account_uses_fp16_ceiling_without_bf16_and_finds_the_file) {
    char dir[] = "/tmp/ceil_t4_XXXXXX", path[256], cmd[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ceilings.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "{\"gpu_name\": \"Tesla T4\", \"gpu_copy_gbps\": 250.0, \"gpu_fp16_tflops\": 40.0, \"gpu_bf16_tflops\": 0.0}");
    fclose(f);
    snprintf(cmd, sizeof cmd, "cd %s && LLM_CEILINGS=%s %s/%s/account --preset llama-3.2-1b --json", dir, path,
             getcwd((char[1024]){0}, 1024), BUILD_BIN_DIR);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char buf[1 << 16];
    buf[fread(buf, 1, sizeof buf - 1, p)] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    cr_assert_not_null(j, "not JSON: %s", e.text);
    cr_expect_float_eq(json_number_value(json_object_get(j, "peak_tflops")), 40.0, 1e-9);
    cr_expect_float_eq(json_number_value(json_object_get(j, "ridge_flops_per_byte")), 40e12 / 250e9, 1e-6);
    const char *src = json_string_value(json_object_get(j, "ceilings_source"));
    cr_expect(src && strstr(src, "fp16 ceiling"), "the source must say the fp16 ceiling is used: %s", src ? src : "(none)");
    cr_expect_not_null(json_object_get(j, "decode_step_floor_s"));
    json_decref(j);
    unlink(path);
    rmdir(dir);
}

// OpenBLAS forced onto its generic SSE kernels (OPENBLAS_CORETYPE=Prescott) on a CPU with AVX:
// the CPU table says so and how to fix it; left alone (the kernels the library picks) it does not.
char *openblas_get_corename(void);  // OpenBLAS: the core type whose kernels it runs

static int matmul_warns(const char *env) {
    char cmd[512], line[2048];
    snprintf(cmd, sizeof cmd, "%s %s/matmul --device cpu --size 64 --check 33,17,20 --csv 2>/dev/null", env, BUILD_BIN_DIR);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    int warned = 0;
    while (fgets(line, sizeof line, p)) warned |= !strncmp(line, "# cpu_warning:", 14) && strstr(line, "OPENBLAS_CORETYPE");
    cr_expect_eq(pclose(p), 0, "%s failed", cmd);
    return warned;
}
Test(step01, generic_openblas_kernels_are_reported) {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx")) cr_skip_test("this CPU has no AVX: the generic kernels are its own");
    cr_expect(matmul_warns("OPENBLAS_CORETYPE=Prescott"), "no warning with OPENBLAS_CORETYPE=Prescott");
    if (getenv("OPENBLAS_CORETYPE")) return;
    // Left to itself OpenBLAS picks by CPU model, and a model it does not know gets its generic
    // kernels even on an AVX-512 CPU (seen on a virtualized Xeon): then the warning is right. So the
    // program must warn exactly when the library's own pick (asked here directly) is one of the
    // SSE-only cores, or an AVX-only one on a CPU with AVX2.
    static const char *const sse[] = {"Generic", "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                      "Katmai", "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona",
                                      "Bobcat", "Nano", "Athlon"};
    static const char *const avx[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"};
    const char *core = openblas_get_corename();
    int generic = 0;
    for (size_t i = 0; i < sizeof sse / sizeof sse[0]; i++) generic |= core && !strcasecmp(core, sse[i]);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        for (size_t i = 0; i < sizeof avx / sizeof avx[0]; i++) generic |= core && !strcasecmp(core, avx[i]);
    cr_expect_eq(matmul_warns(""), generic, "OpenBLAS picked '%s' itself: a warning expected %s", core ? core : "?",
                 generic ? "(its generic kernels)" : "only for generic kernels");
#else
    cr_skip_test("the kernel check is for x86 OpenBLAS builds");
#endif
}

// roofline: the CPU half runs, every ceiling it reports is positive and finite, and the saved
// ceilings file round-trips (a temporary path, so the real build/ceilings.json is untouched).
Test(step01, roofline_cpu_measures_and_saves_ceilings, .timeout = 120) {
    char dir[] = "/tmp/roofline_test_XXXXXX", path[256], cmd[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ceilings.json", dir);
    snprintf(cmd, sizeof cmd, "LLM_CEILINGS=%s %s/roofline --device cpu --quick --reps 2 --json 2>/dev/null", path,
             BUILD_BIN_DIR);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s failed", cmd);
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    cr_assert_not_null(j, "not JSON: %s", e.text);
    json_t *rows = json_object_get(j, "rows"), *r;
    size_t i;
    int scans = 0;
    json_array_foreach(rows, i, r) {
        const char *test = json_string_value(json_object_get(r, "test"));
        double ms = json_number_value(json_object_get(r, "ms"));
        cr_expect(ms > 0 && isfinite(ms), "%s: ms = %g", test, ms);
        if (strstr(test, "batch scan")) scans++;
    }
    cr_expect_geq(scans, 4, "the batch scan must have rows");
    json_decref(j);
    j = json_load_file(path, 0, &e);
    cr_assert_not_null(j, "%s was not written", path);
    cr_expect_gt(json_number_value(json_object_get(j, "cpu_copy_gbps")), 0.1);
    cr_expect_gt(json_number_value(json_object_get(j, "cpu_sgemm_gflops")), 0.1);
    cr_expect_gt(json_number_value(json_object_get(j, "cpu_fp32_gflops")), 0.1);
    json_decref(j);
    unlink(path);
    rmdir(dir);
}

// account counts models the engine cannot run yet (another rope type, an active sliding
// window): the lenient parser accepts them and says what is unsupported; the strict one refuses.
Test(step01, account_counts_models_the_engine_cannot_run) {
    const char *mistral01 =
        "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":4096,\"intermediate_size\":14336,"
        "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,\"vocab_size\":32000,"
        "\"max_position_embeddings\":32768,\"rope_theta\":10000.0,\"sliding_window\":4096}";
    ModelConfig c;
    char err[512] = "";
    cr_assert_eq(hf_config_parse(mistral01, "m", &c, err, sizeof err), -1, "strict parsing must refuse");
    cr_assert_eq(hf_config_parse_lenient(mistral01, "m", &c, err, sizeof err), 0, "%s", err);
    cr_expect(strstr(c.unsupported, "sliding_window"), "unsupported was: '%s'", c.unsupported);
    cr_expect_eq(account_params(&c).total, 7241732096LL, "Mistral-7B-v0.1 published 7,241,732,096");
    const char *yarn = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,"
                       "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0}}";
    cr_assert_eq(hf_config_parse_lenient(yarn, "y", &c, err, sizeof err), 0, "%s", err);
    cr_expect(strstr(c.unsupported, "yarn"), "unsupported was: '%s'", c.unsupported);
    const char *ok = preset_config_json("llama-3.1-8b");
    cr_assert_eq(hf_config_parse_lenient(ok, "l", &c, err, sizeof err), 0);
    cr_expect_str_eq(c.unsupported, "", "a supported model has nothing unsupported");
    cr_expect_eq(hf_config_parse_lenient("{\"architectures\":[\"GPT2LMHeadModel\"]}", "g", &c, err, sizeof err), -1,
                 "an unknown architecture is still refused");
}
