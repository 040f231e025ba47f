// The module's functions that need no engine (the output head and body-kernel checks, n-gram
// lookup, quantizing, the vocabulary check, devices, RPC workers, the diagnostics of `localspec
// check`) and train-head's FeatureCollector.
#include <memory>

#include "draft/ngram_drafter.h"
#include "draft/mtp_drafter.h"
#include "draft/vocab_check.h"
#include "kernels/body_matmul.h"
#include "kernels/q8_head.h"
#include "llama/llama_backend.h"
#include "python/bindings.h"
#include "rpc/rpc.h"
#include "train/feature_collector.h"
#include "train/head_probe.h"

using namespace localspec;

void localspec::register_functions(py::module_& m) {
    // Pure functions used by localspec itself.
    m.def("q8_head_supported", &int8_kernels_supported);
    m.def("faster_body_types", &faster_body_types);
    m.def(
        "ngram_lookup",
        [](const std::vector<Token>& history, int n_min, int n_max, int k) {
            return NgramDrafter(n_min, n_max).lookup_draft(history, k).tokens;
        },
        py::arg("history"), py::arg("n_min"), py::arg("n_max"), py::arg("k"));
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
