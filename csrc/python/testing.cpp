// The _core.testing submodule: building blocks exposed for the tests only (batch planning, the
// controller, the output heads and body kernels, acceptance and sampling, grammars, layer taps).
#include <cmath>
#include <functional>

#include "draft/forced_drafter.h"
#include "engine/batch_plan.h"
#include "engine/controller.h"
#include "kernels/body_matmul.h"
#include "kernels/q6k_head.h"
#include "kernels/q8_head.h"
#include "llama/llama_backend.h"
#include "python/bindings.h"
#include "sample/acceptance.h"
#include "sample/sampling.h"

using namespace localspec;

namespace {

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

}  // namespace

void localspec::register_testing(py::module_& m) {
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
        .def("choose", &DraftController::choose, py::arg("slot") = 0, py::arg("limit") = 1 << 30,
             py::arg("setup_seconds") = 0.0)
        .def(
            "observe",
            [](DraftController& c, int k, int n_accepted, double draft_seconds, double verify_seconds, int slot,
               int lead, int lead_slot, double setup_seconds) {
                c.observe(k, n_accepted, draft_seconds, verify_seconds, slot, DraftLead{lead, lead_slot},
                          setup_seconds);
            },
            py::arg("k"), py::arg("n_accepted"), py::arg("draft_seconds"), py::arg("verify_seconds"),
            py::arg("slot") = 0, py::arg("lead") = 0, py::arg("lead_slot") = 0, py::arg("setup_seconds") = 0.0)
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
        .def("worth_probing", &DraftController::worth_probing, py::arg("slot") = 0)
        .def_property_readonly("timing_noise", &DraftController::timing_noise)
        .def_property_readonly("noisy", &DraftController::noisy)
        .def_property_readonly("probes", &DraftController::probes)
        .def_property_readonly("memory", &DraftController::memory)
        .def("restore", &DraftController::restore)
        .def_property_readonly("k_max", &DraftController::k_max);
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
        "warp_known",
        [](const py::array_t<float, py::array::c_style | py::array::forcecast>& logits, const std::vector<Token>& known,
           float bound, const SamplingParams& params) -> py::object {
            for (Token t : known) {
                if (t < 0 || static_cast<py::ssize_t>(t) >= logits.size()) throw std::out_of_range("a known token is outside the row");
            }
            Distribution d;
            if (!warp_known(logits.data(), known, bound, params, d)) return py::none();
            return py::make_tuple(d.ids, d.probs);
        },
        py::arg("logits"), py::arg("known"), py::arg("bound"), py::arg("params"));
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
}
