// C++ unit tests of the pure parts of the core (built with -DLOCALSPEC_BUILD_CPP_TESTS=ON,
// run with ctest). The pytest suite covers the same functions through the binding; these
// exist so the core can be checked without Python.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "sample/acceptance.h"
#include "engine/controller.h"
#include "engine/text_stream.h"

using namespace localspec;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "FAILED: %s\n", what);
        ++failures;
    }
}

Distribution dist(std::map<Token, float> probs) {
    Distribution d;
    for (auto [id, p] : probs) {
        d.ids.push_back(id);
        d.probs.push_back(p);
    }
    return d;
}

void test_greedy() {
    Acceptance a = accept_greedy({5, 7, 9}, {5, 7, 2, 4});
    check(a.n_accepted == 2 && a.token == 2 && !a.bonus, "greedy: correction after two accepted");
    a = accept_greedy({5, 7}, {5, 7, 11});
    check(a.n_accepted == 2 && a.token == 11 && a.bonus, "greedy: bonus after all accepted");
}

void test_residual() {
    Distribution r = residual(dist({{0, 0.5f}, {1, 0.5f}}), dist({{0, 0.8f}, {1, 0.2f}}));
    check(r.size() == 1 && r.ids[0] == 1 && std::fabs(r.probs[0] - 1.0f) < 1e-6f, "residual: max(0, p - q)");
}

void test_sampled_marginal() {
    // The first emitted token must follow p whatever q is.
    const Distribution p = dist({{0, 0.6f}, {1, 0.3f}, {2, 0.1f}});
    const Distribution q = dist({{0, 0.1f}, {1, 0.2f}, {2, 0.7f}});
    Rng draw(42);
    int counts[3] = {0, 0, 0};
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const Token d = sample(q, draw);
        Rng rng(static_cast<uint64_t>(i) + 1);
        Acceptance a = accept_sampled({d}, {p, p}, {q}, rng);
        ++counts[a.n_accepted ? d : a.token];
    }
    for (int t = 0; t < 3; ++t) {
        const double freq = static_cast<double>(counts[t]) / n;
        check(std::fabs(freq - p.probs[static_cast<size_t>(t)]) < 0.005, "sampled: first token ~ p");
    }
}

void test_text_stream() {
    TextStream s({"STOP"});
    std::string out = s.push("hello ST");
    check(out == "hello ", "stream: holds back a possible stop prefix");
    out = s.push("OP and more");
    check(out.empty() && s.stopped() && s.text() == "hello ", "stream: cuts at the stop string");
    TextStream u({});
    check(u.push("\xC3").empty() && u.push("\xA9") == "\xC3\xA9", "stream: waits for whole UTF-8");
}

void test_controller() {
    DraftController c(8);
    check(c.choose() == 0, "controller: measures plain first");
}

}  // namespace

int main() {
    test_greedy();
    test_residual();
    test_sampled_marginal();
    test_text_stream();
    test_controller();
    if (failures == 0) std::puts("all C++ tests passed");
    return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
