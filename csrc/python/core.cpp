// Core: the engine as Python sees it (generation, batched steps, the measuring tools, the target's
// vocabulary), with the GIL released around the engine's work and the callback's errors kept.
#include <exception>
#include <map>
#include <memory>
#include <optional>

#include "engine/controller.h"
#include "engine/engine.h"
#include "python/bindings.h"

using namespace localspec;

namespace {

std::vector<int> provenance_ints(const std::vector<Provenance>& p) {
    std::vector<int> out;
    out.reserve(p.size());
    for (Provenance v : p) out.push_back(static_cast<int>(v));
    return out;
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
        d["error"] = to_str(result.error);
        d["error_is_users"] = result.error_is_users;
        d["pass_rows"] = result.pass_rows;
        d["pass_emitted"] = result.pass_emitted;
        d["logprobs"] = logprobs_to_list(result.logprobs);
        d["stats"] = result.stats;
        return d;
    }

    std::unique_ptr<SpecEngine> engine_;
    std::map<int, std::shared_ptr<CallbackError>> errors_;  // per started generation
};

}  // namespace

void localspec::register_core(py::module_& m) {
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
            Grammar grammar(c.engine().target(), gbnf);  // throws InvalidParameterError when it does not parse
            return grammar.first_mask_seconds(c.engine().target().vocab().n_tokens);
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
}
