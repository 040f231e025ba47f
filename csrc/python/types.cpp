// The plain structs the module exchanges with Python: engine options, requests, step reports,
// sampling parameters, statistics, the controller's memory, remote devices.
#include <array>

#include "draft/draft_kind.h"
#include "engine/controller.h"
#include "engine/engine.h"
#include "engine/stats.h"
#include "python/bindings.h"
#include "rpc/rpc.h"
#include "sample/sampling.h"

using namespace localspec;

namespace {

// Counts per draft source as {source name: count}, every source present.
py::dict by_source(const std::array<int, DraftKind::kSources>& counts) {
    py::dict out;
    for (int i = 0; i < DraftKind::kSources; ++i)
        out[DraftKind::source_name(static_cast<DraftKind::Source>(i))] = counts[static_cast<size_t>(i)];
    return out;
}

SamplingParams sampling_params(float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                               float repeat_penalty, float frequency_penalty, float presence_penalty,
                               int penalty_last_n) {
    return SamplingParams{temperature,    top_k,         top_p, min_p, seed, repeat_penalty, frequency_penalty,
                          presence_penalty, penalty_last_n};
}

}  // namespace

void localspec::register_types(py::module_& m) {
    py::class_<EngineOptions>(m, "EngineOptions")
        .def(py::init<>())
        .def_readwrite("target_path", &EngineOptions::target_path)
        .def_readwrite("drafter_kind", &EngineOptions::drafter_kind)
        .def_readwrite("drafter_path", &EngineOptions::drafter_path)
        .def_readwrite("n_ctx", &EngineOptions::n_ctx)
        .def_readwrite("n_threads", &EngineOptions::n_threads)
        .def_readwrite("n_gpu_layers_target", &EngineOptions::n_gpu_layers_target)
        .def_readwrite("n_gpu_layers_draft", &EngineOptions::n_gpu_layers_draft)
        .def_readwrite("rpc", &EngineOptions::rpc)
        .def_readwrite("draft_sampling", &EngineOptions::draft_sampling)
        .def_readwrite("ngram_min", &EngineOptions::ngram_min)
        .def_readwrite("ngram_max", &EngineOptions::ngram_max)
        .def_readwrite("recent_ngram_tokens", &EngineOptions::recent_ngram_tokens)
        .def_readwrite("draft_p_min", &EngineOptions::draft_p_min)
        .def_readwrite("draft_vocab", &EngineOptions::draft_vocab)
        .def_readwrite("controller_k_max", &EngineOptions::controller_k_max)
        .def_readwrite("fast_head", &EngineOptions::fast_head)
        .def_readwrite("fast_body", &EngineOptions::fast_body)
        .def_readwrite("exact", &EngineOptions::exact)
        .def_readwrite("repack", &EngineOptions::repack)
        .def_readwrite("flash_attn", &EngineOptions::flash_attn)
        .def_readwrite("kv_type", &EngineOptions::kv_type)
        .def_readwrite("verbose", &EngineOptions::verbose)
        .def_readwrite("n_seq", &EngineOptions::n_seq);

    py::class_<StepReport>(m, "StepReport")
        .def_readonly("finished", &StepReport::finished)
        .def_readonly("sequences", &StepReport::sequences)
        .def_readonly("rows", &StepReport::rows)
        .def_readonly("emitted", &StepReport::emitted)
        .def_readonly("prefilled", &StepReport::prefilled);

    py::class_<ReplayOutcome>(m, "ReplayOutcome")
        .def_readonly("first_mismatch", &ReplayOutcome::first_mismatch)
        .def_readonly("passes", &ReplayOutcome::passes);

    py::class_<GenerateRequest>(m, "GenerateRequest")
        .def(py::init<>())
        .def_readwrite("prompt", &GenerateRequest::prompt)
        .def_property(
            "sampling", [](const GenerateRequest& r) { return r.sampling; },
            [](GenerateRequest& r, const SamplingParams& s) { r.sampling = s; })
        .def_readwrite("max_tokens", &GenerateRequest::max_tokens)
        .def_readwrite("draft_max", &GenerateRequest::draft_max)
        .def_readwrite("ignore_eos", &GenerateRequest::ignore_eos)
        .def_readwrite("adaptive", &GenerateRequest::adaptive)
        .def_readwrite("reuse_cache", &GenerateRequest::reuse_cache)
        .def_readwrite("stop", &GenerateRequest::stop)
        .def_readwrite("grammar", &GenerateRequest::grammar)
        .def_readwrite("grammar_mask_seconds", &GenerateRequest::grammar_mask_seconds)
        .def_readwrite("logprobs", &GenerateRequest::logprobs)
        .def_readwrite("prediction", &GenerateRequest::prediction);

    py::class_<SamplingParams>(m, "SamplingParams")
        .def(py::init(&sampling_params), py::arg("temperature") = 0.8f, py::arg("top_k") = 40,
             py::arg("top_p") = 0.95f, py::arg("min_p") = 0.05f, py::arg("seed") = 0,
             py::arg("repeat_penalty") = 1.0f, py::arg("frequency_penalty") = 0.0f,
             py::arg("presence_penalty") = 0.0f, py::arg("penalty_last_n") = 64)
        .def_readwrite("temperature", &SamplingParams::temperature)
        .def_readwrite("top_k", &SamplingParams::top_k)
        .def_readwrite("top_p", &SamplingParams::top_p)
        .def_readwrite("min_p", &SamplingParams::min_p)
        .def_readwrite("seed", &SamplingParams::seed)
        .def_readwrite("repeat_penalty", &SamplingParams::repeat_penalty)
        .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
        .def_readwrite("presence_penalty", &SamplingParams::presence_penalty)
        .def_readwrite("penalty_last_n", &SamplingParams::penalty_last_n);

    py::class_<GenerationStats>(m, "GenerationStats")
        .def_readonly("prompt_tokens", &GenerationStats::prompt_tokens)
        .def_readonly("cached_prompt_tokens", &GenerationStats::cached_prompt_tokens)
        .def_readonly("n_tokens", &GenerationStats::n_tokens)
        .def_readonly("drafted", &GenerationStats::drafted)
        .def_readonly("accepted", &GenerationStats::accepted)
        .def_readonly("rejected", &GenerationStats::rejected)
        .def_readonly("target_passes", &GenerationStats::target_passes)
        .def_readonly("last_drafted", &GenerationStats::last_drafted)
        .def_readonly("accepted_length_histogram", &GenerationStats::accepted_length_histogram)
        .def_readonly("drafted_by_position", &GenerationStats::drafted_by_position)
        .def_readonly("accepted_by_position", &GenerationStats::accepted_by_position)
        .def_readonly("prefill_seconds", &GenerationStats::prefill_seconds)
        .def_readonly("draft_seconds", &GenerationStats::draft_seconds)
        .def_property_readonly("drafted_by_kind", [](const GenerationStats& s) { return by_source(s.drafted_by_source); })
        .def_property_readonly("accepted_by_kind", [](const GenerationStats& s) { return by_source(s.accepted_by_source); })
        .def_readonly("model_drafted", &GenerationStats::model_drafted)
        .def_readonly("model_draft_seconds", &GenerationStats::model_draft_seconds)
        .def_readonly("candidate_rows", &GenerationStats::candidate_rows)
        .def_readonly("verify_seconds", &GenerationStats::verify_seconds)
        .def_readonly("other_seconds", &GenerationStats::other_seconds)
        .def_readonly("generation_seconds", &GenerationStats::generation_seconds)
        .def_readonly("time_to_first_token", &GenerationStats::time_to_first_token)
        .def_property_readonly("acceptance_rate", &GenerationStats::acceptance_rate)
        .def_property_readonly("mean_accepted_length", &GenerationStats::mean_accepted_length)
        .def_property_readonly("tokens_per_second", &GenerationStats::tokens_per_second)
        .def_property_readonly("prefill_tokens_per_second", &GenerationStats::prefill_tokens_per_second);

    py::class_<ControllerMemory>(m, "ControllerMemory")
        .def(py::init<>())
        .def_readwrite("trials", &ControllerMemory::trials)
        .def_readwrite("hits", &ControllerMemory::hits)
        .def_readwrite("verify", &ControllerMemory::verify)
        .def_readwrite("draft_cost", &ControllerMemory::draft_cost)
        .def_readwrite("evidence_trials", &ControllerMemory::evidence_trials)
        .def_readwrite("evidence_hits", &ControllerMemory::evidence_hits)
        .def_readwrite("timing_noise", &ControllerMemory::timing_noise);

    py::class_<RemoteDeviceInfo>(m, "RemoteDeviceInfo")
        .def_readonly("endpoint", &RemoteDeviceInfo::endpoint)
        .def_readonly("name", &RemoteDeviceInfo::name)
        .def_readonly("free_bytes", &RemoteDeviceInfo::free_bytes)
        .def_readonly("total_bytes", &RemoteDeviceInfo::total_bytes);
}
