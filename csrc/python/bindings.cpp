// The only pybind11 file: converts types and releases the GIL around model work. No logic.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "sample/acceptance.h"
#include "engine/batch_plan.h"
#include "kernels/body_matmul.h"
#include "engine/controller.h"
#include "draft/drafter.h"
#include "engine/engine.h"
#include "train/feature_collector.h"
#include "draft/forced_drafter.h"
#include "train/head_probe.h"
#include "draft/mtp_drafter.h"
#include "kernels/q6k_head.h"
#include "kernels/q8_head.h"
#include "rpc/rpc.h"
#include "draft/vocab_check.h"
#include "base/errors.h"

namespace py = pybind11;
using namespace localspec;

namespace {

// Computes on the calling Python thread without the GIL. Afterwards that thread's OpenMP
// workers are ended (release_compute_threads): kept, they would count against every engine's
// spinning barriers for as long as the thread lives, and each pass would sleep and wake its
// workers instead (the main thread of the test suite, after one head test: sampling tests 4-6x
// slower). Engine threads release theirs when idle (engine_loop.py).
struct ComputeOnCaller {
    py::gil_scoped_release release;
    ~ComputeOnCaller() { release_compute_threads(); }
};

std::vector<int> provenance_ints(const std::vector<Provenance>& p) {
    std::vector<int> out;
    out.reserve(p.size());
    for (Provenance v : p) out.push_back(static_cast<int>(v));
    return out;
}

// Counts per draft source as {source name: count}, every source present.
py::dict by_source(const std::array<int, DraftKind::kSources>& counts) {
    py::dict out;
    for (int i = 0; i < DraftKind::kSources; ++i)
        out[DraftKind::source_name(static_cast<DraftKind::Source>(i))] = counts[static_cast<size_t>(i)];
    return out;
}

py::bytes to_bytes(const std::string& s) { return py::bytes(s); }

// Text from the model can end mid-character only in token_piece; decode leniently there.
py::str to_str(const std::string& s) { return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace")); }

Distribution dense_to_distribution(const py::array_t<double, py::array::c_style | py::array::forcecast>& probs) {
    Distribution d;
    auto r = probs.unchecked<1>();
    for (py::ssize_t i = 0; i < r.shape(0); ++i) {
        if (r(i) > 0) {
            d.ids.push_back(static_cast<Token>(i));
            d.probs.push_back(static_cast<float>(r(i)));
        }
    }
    return d;
}

// For the grammar tests: run(model, grammar) on a vocabulary-only load of `path`, the grammar
// past `accepted`, without the GIL.
void with_grammar(const std::string& path, const std::string& gbnf, const std::vector<Token>& accepted,
                  const std::function<void(const Model&, const Grammar&)>& run) {
    py::gil_scoped_release release;
    backend_init(false);
    const Model model(ModelOptions{path, 0, true});
    Grammar grammar(model, gbnf);
    for (Token t : accepted) grammar.accept(t);
    run(model, grammar);
}

py::dict acceptance_to_dict(const Acceptance& a) {
    py::dict d;
    d["n_accepted"] = a.n_accepted;
    d["token"] = a.token;
    d["bonus"] = a.bonus;
    return d;
}

SamplingParams sampling_params(float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                               float repeat_penalty, float frequency_penalty, float presence_penalty,
                               int penalty_last_n) {
    return SamplingParams{temperature,    top_k,         top_p, min_p, seed, repeat_penalty, frequency_penalty,
                          presence_penalty, penalty_last_n};
}

// (token, logprob, [(id, logprob), ...]) per token.
py::list logprobs_to_list(const std::vector<TokenLogprob>& logprobs) {
    py::list out;
    for (const TokenLogprob& lp : logprobs) out.append(py::make_tuple(lp.token, lp.logprob, lp.top));
    return out;
}

class Core {
public:
    explicit Core(const EngineOptions& options) {
        py::gil_scoped_release release;
        engine_ = std::make_unique<SpecEngine>(options);
    }

    SpecEngine& engine() {
        if (!engine_) throw std::runtime_error("this core has been closed");
        return *engine_;
    }

    // One generation from start to end, with the GIL released except in the callback.
    py::dict generate(const GenerateRequest& request, const py::object& callback) {
        auto error = std::make_shared<CallbackError>();
        const ChunkCallback on_chunk = chunk_callback(callback, error);
        GenerateResult result;
        {
            py::gil_scoped_release release;
            result = engine().generate(request, on_chunk);
        }
        if (*error) throw std::move(**error);
        return result_dict(result);
    }

    // Batched generation (SpecEngine::start / step / take_result).
    int start(const GenerateRequest& request, const py::object& callback) {
        auto error = std::make_shared<CallbackError>();
        ChunkCallback on_chunk = chunk_callback(callback, error);
        int id = 0;
        {
            py::gil_scoped_release release;
            id = engine().start(request, std::move(on_chunk));
        }
        errors_[id] = error;
        return id;
    }

    // A failed step drops every started generation: their kept callback errors go with them.
    StepReport step() {
        StepReport report;
        std::exception_ptr failure;
        {
            py::gil_scoped_release release;
            try {
                report = engine().step();
            } catch (...) {
                failure = std::current_exception();
            }
        }
        if (failure) {
            errors_.clear();
            std::rethrow_exception(failure);
        }
        return report;
    }

    py::dict take_result(int id) {
        GenerateResult result = engine().take_result(id);
        const auto it = errors_.find(id);
        std::shared_ptr<CallbackError> error = it != errors_.end() ? it->second : nullptr;
        if (it != errors_.end()) errors_.erase(it);
        if (error && *error) throw std::move(**error);
        return result_dict(result);
    }

    ReplayOutcome replay_greedy(const std::vector<Token>& prompt, const std::vector<Token>& tokens,
                      const std::vector<int>& rows, const std::vector<int>& emitted, const GenerateRequest& shaping) {
        py::gil_scoped_release release;
        return engine().replay_greedy(prompt, tokens, rows, emitted, shaping);
    }

    py::array_t<float> next_token_logits(const std::vector<Token>& tokens, int batch_rows) {
        std::vector<float> logits;
        {
            py::gil_scoped_release release;
            logits = engine().next_token_logits(tokens, batch_rows);
        }
        return py::array_t<float>(static_cast<py::ssize_t>(logits.size()), logits.data());
    }

    py::array_t<float> pass_logits(const std::vector<Token>& tokens, int rows) {
        std::vector<float> logits;
        {
            py::gil_scoped_release release;
            logits = engine().pass_logits(tokens, rows);
        }
        const auto n_vocab = static_cast<py::ssize_t>(engine().target().vocab().n_tokens);
        py::array_t<float> out({static_cast<py::ssize_t>(logits.size()) / n_vocab, n_vocab});
        std::copy(logits.begin(), logits.end(), out.mutable_data());
        return out;
    }

    std::vector<double> pass_seconds(const std::vector<Token>& context, int max_rows, int repeats) {
        py::gil_scoped_release release;
        return engine().pass_seconds(context, max_rows, repeats);
    }

    void warm_up(const std::vector<Token>& context) {
        py::gil_scoped_release release;
        engine().warm_up(context);
    }

    void close() {
        py::gil_scoped_release release;
        engine_.reset();
    }

private:
    using CallbackError = std::optional<py::error_already_set>;

    // The Python callable, called with the GIL; an exception it raises is kept for the caller
    // and cancels the generation. Dropped with the GIL held (the engine may drop it without).
    static ChunkCallback chunk_callback(const py::object& callback, const std::shared_ptr<CallbackError>& error) {
        if (callback.is_none()) return nullptr;
        auto fn = std::shared_ptr<py::object>(new py::object(callback), [](py::object* p) {
            py::gil_scoped_acquire acquire;
            delete p;
        });
        return [fn, error](const Chunk& chunk) {
            py::gil_scoped_acquire acquire;
            try {
                return (*fn)(to_str(chunk.text), chunk.tokens, provenance_ints(chunk.provenance), chunk.stats,
                             logprobs_to_list(chunk.logprobs))
                    .cast<bool>();
            } catch (py::error_already_set& e) {
                error->emplace(std::move(e));
                return false;
            }
        };
    }

    static py::dict result_dict(const GenerateResult& result) {
        py::dict d;
        d["text"] = to_str(result.text);
        d["tokens"] = result.tokens;
        d["provenance"] = provenance_ints(result.provenance);
        d["finish_reason"] = result.finish_reason;
        d["pass_rows"] = result.pass_rows;
        d["pass_emitted"] = result.pass_emitted;
        d["logprobs"] = logprobs_to_list(result.logprobs);
        d["stats"] = result.stats;
        return d;
    }

    std::unique_ptr<SpecEngine> engine_;
    std::map<int, std::shared_ptr<CallbackError>> errors_;  // per started generation
};

// Logits of an output head over rows of hidden states, for the tests: `blocks` holds ggml's
// bytes of an n_vocab x n_embd matrix (BLOCK_VALUES weights per block), `hidden` rows x n_embd.
template <typename Block, typename Head,
          void (*Reference)(const Block*, int64_t, int, const float*, int, float*), int BLOCK_VALUES>
py::array_t<float> head_logits(const py::array_t<uint8_t, py::array::c_style>& blocks, int64_t n_vocab, int n_embd,
                               const py::array_t<float, py::array::c_style>& hidden, bool reference, int n_threads,
                               const std::string& kernel) {
    const auto n_rows = static_cast<int>(hidden.size() / n_embd);
    if (n_embd % BLOCK_VALUES != 0 ||
        static_cast<size_t>(blocks.size()) != static_cast<size_t>(n_vocab) * (n_embd / BLOCK_VALUES) * sizeof(Block) ||
        hidden.size() != static_cast<py::ssize_t>(n_rows) * n_embd) {
        throw std::invalid_argument("blocks or hidden have the wrong size");
    }
    const auto* rows = reinterpret_cast<const Block*>(blocks.data());
    py::array_t<float> out({static_cast<py::ssize_t>(n_rows), static_cast<py::ssize_t>(n_vocab)});
    float* dst = out.mutable_data();
    const float* x = hidden.data();
    {
        ComputeOnCaller compute;
        if (reference) {
            Reference(rows, n_vocab, n_embd, x, n_rows, dst);
        } else {
            Head(rows, n_vocab, n_embd).compute(x, n_rows, dst, n_threads, kernel);
        }
    }
    return out;
}
// The same head's logits of one hidden row at chosen tokens only (OutputHead::compute_ids).
template <typename Block, typename Head, int BLOCK_VALUES>
std::vector<float> head_logits_at(const py::array_t<uint8_t, py::array::c_style>& blocks, int64_t n_vocab, int n_embd,
                                  const py::array_t<float, py::array::c_style>& hidden, const std::vector<int32_t>& ids) {
    if (n_embd % BLOCK_VALUES != 0 || hidden.size() != n_embd ||
        static_cast<size_t>(blocks.size()) != static_cast<size_t>(n_vocab) * (n_embd / BLOCK_VALUES) * sizeof(Block)) {
        throw std::invalid_argument("blocks or hidden have the wrong size");
    }
    std::vector<float> row(static_cast<size_t>(n_vocab), NAN);
    {
        ComputeOnCaller compute;
        Head(reinterpret_cast<const Block*>(blocks.data()), n_vocab, n_embd).compute_ids(hidden.data(), ids, row.data());
    }
    std::vector<float> out;
    for (int32_t id : ids) out.push_back(row.at(static_cast<size_t>(id)));
    return out;
}
#define HEAD_LOGITS_AT_ARGS py::arg("blocks"), py::arg("n_vocab"), py::arg("n_embd"), py::arg("hidden"), py::arg("ids")
#define HEAD_LOGITS_ARGS                                                                                  \
    py::arg("blocks"), py::arg("n_vocab"), py::arg("n_embd"), py::arg("hidden"), py::arg("reference") = false, \
        py::arg("n_threads") = 2, py::arg("kernel") = ""

void translate_user_error(const UserError& e) {
    static const char* names[] = {"ModelLoadError", "VocabMismatchError", "PromptTooLongError",
                                  "InvalidParameterError", "RemoteWorkerError", "RpcUnavailableError"};
    py::object cls = py::module_::import("localspec.errors").attr(names[static_cast<int>(e.kind)]);
    PyErr_SetString(cls.ptr(), e.what());
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "localspec C++ core: speculative decoding over llama.cpp";
    m.attr("AUTO_DRAFT_MAX") = kAutoDraftMax;

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const UserError& e) {
            translate_user_error(e);
        }
    });

    py::class_<EngineOptions>(m, "EngineOptions")
        .def(py::init<>())
        .def_readwrite("target_path", &EngineOptions::target_path)
        .def_readwrite("drafter", &EngineOptions::drafter)
        .def_readwrite("n_ctx", &EngineOptions::n_ctx)
        .def_readwrite("n_threads", &EngineOptions::n_threads)
        .def_readwrite("n_gpu_layers_target", &EngineOptions::n_gpu_layers_target)
        .def_readwrite("n_gpu_layers_draft", &EngineOptions::n_gpu_layers_draft)
        .def_readwrite("rpc", &EngineOptions::rpc)
        .def_readwrite("draft_sampling", &EngineOptions::draft_sampling)
        .def_readwrite("ngram_min", &EngineOptions::ngram_min)
        .def_readwrite("ngram_max", &EngineOptions::ngram_max)
        .def_readwrite("draft_p_min", &EngineOptions::draft_p_min)
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
        .def_readwrite("logprobs", &GenerateRequest::logprobs);

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

    py::class_<Core>(m, "Core")
        .def(py::init<const EngineOptions&>())
        .def("generate", &Core::generate, py::arg("request"), py::arg("on_chunk") = py::none())
        .def("start", &Core::start, py::arg("request"), py::arg("on_chunk") = py::none())
        .def("step", &Core::step)
        .def("take_result", &Core::take_result, py::arg("id"))
        .def("cancel", [](Core& c, int id) { c.engine().cancel(id); }, py::arg("id"))
        .def("n_seq", [](Core& c) { return c.engine().n_seq(); })
        .def("n_active", [](Core& c) { return c.engine().n_active(); })
        // Keeps the GIL (microseconds): a thread that released it here could be stopped by
        // interpreter shutdown inside pybind11's destructor that takes it back.
        .def("release_compute_threads", [](Core&) { release_compute_threads(); })
        .def("next_token_logits", &Core::next_token_logits, py::arg("tokens"), py::arg("batch_rows") = 1)
        .def("pass_logits", &Core::pass_logits, py::arg("tokens"), py::arg("rows"))
        .def("pass_seconds", &Core::pass_seconds, py::arg("context"), py::arg("max_rows"), py::arg("repeats"))
        .def("warm_up", &Core::warm_up, py::arg("context"))
        .def("replay_greedy", &Core::replay_greedy)
        .def("controller_memory", [](Core& c) { return c.engine().controller_memory(); })
        .def("restore_controller_memory",
             [](Core& c, const ControllerMemory& memory) { c.engine().restore_controller_memory(memory); })
        .def("tokenize", [](Core& c, const std::string& text, bool add_special, bool parse_special) {
            py::gil_scoped_release release;  // a long prompt must not stall other Python threads
            return c.engine().target().tokenize(text, add_special, parse_special);
        })
        .def("detokenize", [](Core& c, const std::vector<Token>& t) {
            std::string text;
            {
                py::gil_scoped_release release;
                text = c.engine().target().detokenize(t);
            }
            return to_str(text);
        })
        .def("check_grammar", [](Core& c, const std::string& gbnf) {
            py::gil_scoped_release release;
            Grammar(c.engine().target(), gbnf);  // throws InvalidParameterError when it does not parse
        })
        .def("token_text", [](Core& c, Token t) { return to_str(c.engine().target().token_text(t)); })
        .def("token_piece", [](Core& c, Token t) { return to_bytes(c.engine().target().token_piece(t)); })
        .def("is_end_of_generation", [](Core& c, Token t) { return c.engine().target().is_end_of_generation(t); })
        .def("chat_template", [](Core& c) { return to_str(c.engine().target().chat_template()); })
        .def("description", [](Core& c) { return to_str(c.engine().target().description()); })
        .def("metadata", [](Core& c, const std::string& key) { return to_str(c.engine().target().metadata(key)); })
        .def("n_vocab", [](Core& c) { return c.engine().target().vocab().n_tokens; })
        .def("bos", [](Core& c) { return c.engine().target().vocab().bos; })
        .def("eos", [](Core& c) { return c.engine().target().vocab().eos; })
        .def("n_ctx", [](Core& c) { return c.engine().n_ctx(); })
        .def("memory_kind", [](Core& c) { return c.engine().target().memory_kind(); })
        .def("rollback_depth", [](Core& c) { return c.engine().rollback_depth(); })
        .def("drafter_name", [](Core& c) { return c.engine().drafter_name(); })
        .def("verify_head", [](Core& c) { return c.engine().verify_head(); })
        .def("draft_head", [](Core& c) { return c.engine().draft_head(); })
        .def("last_logits_head", [](Core& c) { return c.engine().last_logits_head(); })
        .def("close", &Core::close);

    py::class_<ControllerMemory>(m, "ControllerMemory")
        .def(py::init<>())
        .def_readwrite("trials", &ControllerMemory::trials)
        .def_readwrite("hits", &ControllerMemory::hits)
        .def_readwrite("verify", &ControllerMemory::verify)
        .def_readwrite("draft_cost", &ControllerMemory::draft_cost);

    // Building blocks exposed for the tests only (localspec._core.testing).
    py::module_ testing = m.def_submodule("testing", "pure functions and classes for the tests");
    py::class_<PassCostCurve>(testing, "PassCostCurve")
        .def(py::init<>())
        .def("observe", &PassCostCurve::observe, py::arg("rows"), py::arg("seconds"))
        .def("seconds", &PassCostCurve::seconds, py::arg("rows"));
    testing.def("batch_draft_lengths", &batch_draft_lengths, py::arg("gains"), py::arg("cost"), py::arg("base_rows"),
                py::arg("base_tokens"), py::arg("probe") = false);
    testing.def("plan_prefill", &plan_prefill, py::arg("remaining"), py::arg("others_running"), py::arg("chunk"));

    py::enum_<DraftController::Estimate>(testing, "Estimate")
        .value("MEAN", DraftController::Estimate::Mean)
        .value("PESSIMISTIC", DraftController::Estimate::Pessimistic)
        .value("OPTIMISTIC", DraftController::Estimate::Optimistic);

    py::class_<DraftController>(testing, "DraftController")
        .def(py::init<int>())
        .def("begin_request", &DraftController::begin_request)
        .def("choose", &DraftController::choose, py::arg("slot") = 0, py::arg("limit") = 1 << 30)
        .def(
            "observe",
            [](DraftController& c, int k, int n_accepted, double draft_seconds, double verify_seconds, int slot,
               int lead, int lead_slot) {
                c.observe(k, n_accepted, draft_seconds, verify_seconds, slot, DraftLead{lead, lead_slot});
            },
            py::arg("k"), py::arg("n_accepted"), py::arg("draft_seconds"), py::arg("verify_seconds"),
            py::arg("slot") = 0, py::arg("lead") = 0, py::arg("lead_slot") = 0)
        .def("seed_verify_seconds", &DraftController::seed_verify_seconds, py::arg("rows"), py::arg("seconds"))
        .def("observe_acceptance", &DraftController::observe_acceptance, py::arg("k"), py::arg("n_accepted"),
             py::arg("slot") = 0)
        .def("acceptance", &DraftController::acceptance, py::arg("slot") = 0, py::arg("position") = -1)
        .def("pessimistic_acceptance", &DraftController::pessimistic_acceptance, py::arg("slot") = 0,
             py::arg("position") = 0)
        .def("verify_seconds", &DraftController::verify_seconds)
        .def("draft_seconds_per_token", &DraftController::draft_seconds_per_token, py::arg("slot") = 0)
        .def("expected_rate", &DraftController::expected_rate, py::arg("k"), py::arg("slot") = 0,
             py::arg("estimate") = DraftController::Estimate::Mean)
        .def_property_readonly("credit", &DraftController::credit)
        .def_property_readonly("memory", &DraftController::memory)
        .def("restore", &DraftController::restore)
        .def_property_readonly("k_max", &DraftController::k_max);

    // Pure functions used by localspec itself.
    m.def("q8_head_supported", &Q8Head::cpu_supported);
    m.def("faster_body_types", &faster_body_types);
    testing.def("q8_head_logits", &head_logits<Q8Block, Q8Head, q8_head_reference, 32>, HEAD_LOGITS_ARGS);
    testing.def("q8_head_kernels", &Q8Head::kernel_names);
    testing.def("body_kernels_available", &body_kernels_available);
    testing.def("body_kernel_tensors", &body_kernel_tensors);
    testing.def(
        "body_matmul",
        [](const std::string& type, const py::bytes& weights, int64_t n_out, int n_in,
           const py::array_t<float, py::array::c_style | py::array::forcecast>& x, int n_threads, bool localspec,
           int repeat) {
            const std::string raw = weights;
            std::vector<uint8_t> bytes(raw.begin(), raw.end());
            std::vector<float> rows(x.data(), x.data() + x.size());
            std::vector<float> out;
            {
                ComputeOnCaller compute;
                out = body_matmul_via_ggml(type, bytes, n_out, n_in, rows, n_threads, localspec, repeat);
            }
            return py::array_t<float>({static_cast<py::ssize_t>(out.size()) / n_out, static_cast<py::ssize_t>(n_out)},
                                      out.data());
        },
        py::arg("type"), py::arg("weights"), py::arg("n_out"), py::arg("n_in"), py::arg("x"), py::arg("n_threads"),
        py::arg("localspec"), py::arg("repeat") = 1);
    testing.def("q8_head_packed_bytes", &Q8Head::packed_bytes, py::arg("n_vocab"), py::arg("n_embd"));
    testing.def("q8_head_logits_at", &head_logits_at<Q8Block, Q8Head, 32>, HEAD_LOGITS_AT_ARGS);
    testing.def("q6k_head_logits_at", &head_logits_at<Q6KBlock, Q6KHead, 256>, HEAD_LOGITS_AT_ARGS);
    testing.def("q6k_head_logits", &head_logits<Q6KBlock, Q6KHead, q6k_head_reference, 256>, HEAD_LOGITS_ARGS);
    testing.def("q6k_head_packed_bytes", &Q6KHead::packed_bytes, py::arg("n_vocab"), py::arg("n_embd"));
    m.def(
        "ngram_lookup",
        [](const std::vector<Token>& history, int n_min, int n_max, int k) {
            return NgramDrafter(n_min, n_max).lookup_draft(history, k).tokens;
        },
        py::arg("history"), py::arg("n_min"), py::arg("n_max"), py::arg("k"));
    testing.def("accept_greedy", [](const std::vector<Token>& drafts, const std::vector<Token>& argmaxes) {
        return acceptance_to_dict(accept_greedy(drafts, argmaxes));
    });
    testing.def(
        "accept_sampled",
        [](const std::vector<Token>& drafts, const std::vector<py::array_t<double>>& p,
           const std::vector<py::array_t<double>>& q, uint64_t seed) {
            std::vector<Distribution> pd, qd;
            for (const auto& row : p) pd.push_back(dense_to_distribution(row));
            for (const auto& row : q) qd.push_back(dense_to_distribution(row));
            Rng rng(seed);
            return acceptance_to_dict(accept_sampled(drafts, pd, qd, rng));
        },
        py::arg("drafts"), py::arg("p"), py::arg("q"), py::arg("seed"));
    testing.def(
        "accept_coupled",
        [](const std::vector<Token>& drafts, const std::vector<py::array_t<double>>& p, const std::vector<double>& u) {
            std::vector<Distribution> pd;
            for (const auto& row : p) pd.push_back(dense_to_distribution(row));
            if (pd.size() != drafts.size() + 1) throw std::invalid_argument("need k + 1 target distributions");
            return acceptance_to_dict(accept_coupled(drafts, [&pd](size_t i) { return pd[i]; }, u));
        },
        py::arg("drafts"), py::arg("p"), py::arg("u"));
    testing.def("warp", [](const py::array_t<float, py::array::c_style | py::array::forcecast>& logits,
                     const SamplingParams& params) {
        Distribution d = warp(logits.data(), static_cast<int>(logits.size()), params);
        return py::make_tuple(d.ids, d.probs);
    });
    testing.def(
        "apply_penalties",
        [](const py::array_t<float, py::array::c_style | py::array::forcecast>& logits,
           const std::vector<Token>& context, const SamplingParams& params) {
            std::vector<float> out(logits.data(), logits.data() + logits.size());
            apply_penalties(out.data(), static_cast<int>(out.size()), context, params);
            return py::array_t<float>(static_cast<py::ssize_t>(out.size()), out.data());
        },
        py::arg("logits"), py::arg("context"), py::arg("params"));
    testing.def("argmax", [](const py::array_t<float, py::array::c_style | py::array::forcecast>& logits) {
        if (logits.size() == 0) throw std::invalid_argument("argmax of no logits");
        return argmax(logits.data(), static_cast<int>(logits.size()));
    });
    testing.def("top_probability", [](const py::array_t<float, py::array::c_style | py::array::forcecast>& logits) {
        if (logits.size() == 0) throw std::invalid_argument("top_probability of no logits");
        const auto n = static_cast<int>(logits.size());
        return top_probability(logits.data(), n, argmax(logits.data(), n));
    });
    m.def("quantize", [](const std::string& in, const std::string& out, const std::string& type, int threads) {
        backend_init(false);
        py::gil_scoped_release release;
        quantize_model(in, out, type, threads);
    });
    m.def("compare_vocab", [](const std::string& target_path, const std::string& draft_path) {
        VocabComparison cmp;
        {
            py::gil_scoped_release release;
            backend_init(false);
            Model target(ModelOptions{target_path, 0, true});
            Model draft(ModelOptions{draft_path, 0, true});
            cmp = compare_vocab(target, draft);
        }
        auto info = [](const VocabInfo& v) {
            py::dict d;
            d["type"] = v.type;
            d["n_tokens"] = v.n_tokens;
            d["bos"] = v.bos;
            d["eos"] = v.eos;
            return d;
        };
        py::dict d;
        d["target"] = info(cmp.target);
        d["draft"] = info(cmp.draft);
        d["first_difference"] = cmp.first_difference;
        d["target_text"] = to_str(cmp.target_text);
        d["draft_text"] = to_str(cmp.draft_text);
        d["problem"] = cmp.problem;
        return d;
    });
    testing.def("forced_text", [](const std::string& path, const std::string& gbnf, const std::vector<Token>& accepted,
                                  size_t max_chars) {
        std::string text;
        with_grammar(path, gbnf, accepted, [&](const Model& model, const Grammar& grammar) {
            text = ForcedText(model).find(grammar, max_chars);
        });
        return to_bytes(text);
    }, py::arg("path"), py::arg("gbnf"), py::arg("accepted"), py::arg("max_chars"));
    testing.def("forced_candidates", [](const std::string& path, const std::string& gbnf,
                                        const std::vector<Token>& accepted, const std::string& rest, size_t max) {
        std::vector<Token> candidates, allowed;
        with_grammar(path, gbnf, accepted, [&](const Model& model, const Grammar& grammar) {
            candidates = ForcedText(model).candidates(rest, max);
            std::vector<Token> all(static_cast<size_t>(model.vocab().n_tokens));
            for (size_t t = 0; t < all.size(); ++t) all[t] = static_cast<Token>(t);
            allowed = grammar.allowed(all);
        });
        return std::make_pair(candidates, allowed);
    }, py::arg("path"), py::arg("gbnf"), py::arg("accepted"), py::arg("rest"), py::arg("max"));
    testing.def("layer_inputs", [](const std::string& path, const std::vector<Token>& tokens, const std::vector<int>& layers,
                             bool extracted) {
        std::vector<float> rows;
        {
            ComputeOnCaller compute;
            backend_init(false);
            const Model model(ModelOptions{path, 0});
            rows = extracted ? extracted_layer_inputs(model, tokens, layers) : tapped_layer_inputs(model, tokens, layers);
        }
        py::array_t<float> out({static_cast<py::ssize_t>(tokens.size()), static_cast<py::ssize_t>(rows.size() / std::max<size_t>(1, tokens.size()))});
        std::copy(rows.begin(), rows.end(), out.mutable_data());
        return out;
    }, py::arg("path"), py::arg("tokens"), py::arg("layers"), py::arg("extracted"));
    py::class_<FeatureCollector>(m, "FeatureCollector")
        .def(py::init([](const std::string& path, const std::vector<int>& layers, int n_ctx, int n_threads) {
                 py::gil_scoped_release release;
                 backend_init(false);
                 return std::make_unique<FeatureCollector>(path, layers, n_ctx, n_threads);
             }),
             py::arg("path"), py::arg("layers"), py::arg("n_ctx"), py::arg("n_threads"))
        .def_property_readonly("feature_width", &FeatureCollector::feature_width)
        .def_property_readonly("n_ctx", &FeatureCollector::n_ctx)
        .def_property_readonly("n_vocab", [](const FeatureCollector& c) { return c.model().vocab().n_tokens; })
        .def_property_readonly("n_embd", [](const FeatureCollector& c) { return c.model().n_embd(); })
        .def_property_readonly("bos", [](const FeatureCollector& c) { return c.model().vocab().bos; })
        .def_property_readonly("eos", [](const FeatureCollector& c) { return c.model().vocab().eos; })
        .def("token_text", [](const FeatureCollector& c, Token t) { return to_str(c.model().token_text(t)); })
        .def("chat_template", [](const FeatureCollector& c) { return to_str(c.model().chat_template()); })
        .def("tokenize", [](const FeatureCollector& c, const std::string& text, bool add_special, bool parse_special) {
            return c.model().tokenize(text, add_special, parse_special);
        })
        .def("collect", [](FeatureCollector& c, const std::vector<Token>& tokens) {
            std::vector<float> features;
            std::vector<Token> argmax;
            {
                ComputeOnCaller compute;
                c.collect(tokens, features, argmax);
            }
            const auto n = static_cast<py::ssize_t>(tokens.size());
            py::array_t<float> f({n, static_cast<py::ssize_t>(c.feature_width())});
            std::copy(features.begin(), features.end(), f.mutable_data());
            py::array_t<int32_t> a(n);
            std::copy(argmax.begin(), argmax.end(), a.mutable_data());
            return py::make_tuple(f, a);
        }, py::arg("tokens"));
    m.def("token_embeddings", [](const std::string& path, const std::vector<Token>& ids) {
        std::vector<float> rows;
        {
            ComputeOnCaller compute;
            rows = token_embedding_rows(path, ids);
        }
        const auto n = static_cast<py::ssize_t>(ids.size());
        py::array_t<float> out({n, n > 0 ? static_cast<py::ssize_t>(rows.size()) / n : py::ssize_t{0}});
        std::copy(rows.begin(), rows.end(), out.mutable_data());
        return out;
    }, py::arg("path"), py::arg("ids"));
    // An EAGLE-3 head's draft-vocabulary logits on given target features, run as the drafter runs
    // it (csrc/train/head_probe.h): `localspec check`'s diagnostic and the training parity tests.
    m.def("eagle3_head_logits", [](const std::string& target, const std::string& head, const std::vector<Token>& tokens,
                                   const py::array_t<float, py::array::c_style | py::array::forcecast>& features,
                                   const std::vector<Token>& unroll, bool f32_cache, int n_threads) {
        const std::vector<float> rows(features.data(), features.data() + features.size());
        HeadProbe probe;
        {
            ComputeOnCaller compute;
            backend_init(false);
            probe = probe_head(target, head, tokens, rows, unroll, f32_cache, n_threads);
        }
        auto matrix = [&](const std::vector<float>& v, int width) {
            py::array_t<float> out({static_cast<py::ssize_t>(probe.n_rows), static_cast<py::ssize_t>(width)});
            std::copy(v.begin(), v.end(), out.mutable_data());
            return out;
        };
        py::dict d;
        d["logits"] = matrix(probe.logits, probe.n_draft);
        d["prenorm"] = matrix(probe.prenorm, probe.n_embd);
        d["normed"] = matrix(probe.normed, probe.n_embd);
        d["d2t"] = probe.d2t;
        return d;
    }, py::arg("target"), py::arg("head"), py::arg("tokens"), py::arg("features"), py::arg("unroll"),
       py::arg("f32_cache") = true, py::arg("n_threads") = 1);
    m.def("memory_kind", [](const std::string& path) {
        py::gil_scoped_release release;
        backend_init(false);
        return Model(ModelOptions{path, 0, true}).memory_kind();
    }, py::arg("path"));
    m.def("mtp_unsupported", [](const std::string& path) {
        py::gil_scoped_release release;
        backend_init(false);
        return mtp_unsupported(path);
    }, py::arg("path"));
    // The MTP layers' first-draft logits at every position, computed as the drafter computes them
    // (csrc/draft/mtp_drafter.h): `localspec check`'s diagnostic.
    m.def("mtp_first_logits", [](const std::string& target, const std::vector<Token>& tokens, int n_threads) {
        std::vector<float> rows;
        {
            ComputeOnCaller compute;
            backend_init(false);
            rows = mtp_first_logits(target, tokens, n_threads);
        }
        const auto n = static_cast<py::ssize_t>(tokens.size());
        py::array_t<float> out({n, n > 0 ? static_cast<py::ssize_t>(rows.size()) / n : py::ssize_t{0}});
        std::copy(rows.begin(), rows.end(), out.mutable_data());
        return out;
    }, py::arg("target"), py::arg("tokens"), py::arg("n_threads") = 1);
    m.def("backend_init", &backend_init, py::arg("verbose") = false);
    m.def("list_devices", [] {
        backend_init(false);
        py::list out;
        for (const DeviceInfo& d : list_devices()) {
            py::dict item;
            item["name"] = d.name;
            item["description"] = d.description;
            item["kind"] = d.kind;
            item["free_bytes"] = d.free_bytes;
            item["total_bytes"] = d.total_bytes;
            out.append(item);
        }
        return out;
    });
    // RPC workers (rpc.h)
    m.def("rpc_supported", [] {
        backend_init(false);
        return rpc_supported();
    });
    m.def("rpc_install_hint", &rpc_install_hint);
    m.def("rpc_failure", &rpc_failure, py::arg("endpoints"));
    m.def("rpc_lost", &rpc_lost, py::arg("endpoints"));
    m.def("rpc_reconnect", [](const std::vector<std::string>& endpoints) {
        py::gil_scoped_release release;
        rpc_reconnect(endpoints);
    }, py::arg("endpoints"));
    py::class_<RemoteDeviceInfo>(m, "RemoteDeviceInfo")
        .def_readonly("endpoint", &RemoteDeviceInfo::endpoint)
        .def_readonly("name", &RemoteDeviceInfo::name)
        .def_readonly("free_bytes", &RemoteDeviceInfo::free_bytes)
        .def_readonly("total_bytes", &RemoteDeviceInfo::total_bytes);
    m.def("remote_devices", [](const std::vector<std::string>& endpoints) {
        backend_init(false);
        py::gil_scoped_release release;
        return remote_devices(endpoints);
    }, py::arg("endpoints"));
    m.def("default_worker_devices", [] {
        backend_init(false);
        return default_worker_devices();
    });
    m.def("serve_rpc_worker", [](const std::string& endpoint, const std::vector<std::string>& devices, int n_threads) {
        backend_init(false);
        py::gil_scoped_release release;
        serve_rpc_worker(endpoint, devices, n_threads);
    }, py::arg("endpoint"), py::arg("devices"), py::arg("n_threads"));
}
