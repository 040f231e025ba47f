#include "train/head_probe.h"

#include <algorithm>
#include <stdexcept>

#include "draft/eagle3_head.h"

namespace localspec {

namespace {

void append_row(std::vector<float>& out, const float* row, int width) { out.insert(out.end(), row, row + width); }

}  // namespace

HeadProbe probe_head(const std::string& target_path, const std::string& head_path, const std::vector<Token>& tokens,
                     const std::vector<float>& features, const std::vector<Token>& unroll, bool f32_cache,
                     int n_threads) {
    if (tokens.size() < 2) throw std::invalid_argument("probe_head needs at least two tokens");
    const Model target(ModelOptions{target_path, 0});
    const Model head(ModelOptions{head_path, 0});
    ContextOptions options;
    options.n_ctx = std::max<int>(64, static_cast<int>(tokens.size() + unroll.size()) + 8);
    options.n_threads = n_threads;
    const Context target_ctx(target, options);
    HeadContext ctx(head, target_ctx, n_threads, f32_cache);
    const DraftVocabHead vocab(head_path, target_ctx.n_vocab());
    const int n = static_cast<int>(tokens.size());
    const int width = static_cast<int>(features.size() / static_cast<size_t>(n));
    HeadProbe out;
    out.n_embd = ctx.n_embd();
    out.n_draft = static_cast<int>(vocab.n_draft());
    for (int i = 0; i < out.n_draft; ++i) out.d2t.push_back(vocab.target_id(i));
    std::vector<float> g, logits(static_cast<size_t>(out.n_draft));
    auto record = [&](int rows) {
        for (int r = 0; r < rows; ++r) {
            append_row(out.prenorm, ctx.prenorm(r), out.n_embd);
            append_row(out.normed, ctx.normed(r), out.n_embd);
            vocab.compute(ctx.normed(r), logits.data(), n_threads);
            append_row(out.logits, logits.data(), out.n_draft);
        }
        out.n_rows += rows;
    };
    ctx.encode(features.data(), n - 1, width, g);
    ctx.decode(tokens.data() + 1, g.data(), n - 1);
    record(n - 1);
    for (Token token : unroll) {
        const float* state = ctx.prenorm(ctx.n_rows() - 1);
        g.assign(state, state + out.n_embd);
        ctx.decode(&token, g.data(), 1);
        record(1);
    }
    return out;
}

}  // namespace localspec
