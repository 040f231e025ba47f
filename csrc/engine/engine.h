// The speculative engine: a target model, a drafter, and the generation loop.
// Not thread-safe: one thread (the Python engine thread) owns an instance.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/controller.h"
#include "draft/drafter.h"
#include "draft/recent_outputs.h"
#include "llama/llama_backend.h"
#include "sample/sampling.h"
#include "engine/stats.h"

namespace localspec {

struct DrafterSpec;  // EngineOptions' drafter_kind and drafter_path, checked (engine.cpp)
struct Sequence;     // one generation in flight (sequence.h)

enum class Provenance : uint8_t { Draft = 0, Target = 1 };

// The longest draft the adaptive controller may choose ("auto" draft length; Python reads it
// as _core.AUTO_DRAFT_MAX).
constexpr int kAutoDraftMax = 15;
// The newest positions a recurrent or hybrid target keeps snapshots of, so that a rollback can
// drop them (Context::rollback_depth): enough for the longest "auto" draft, and the step caps
// fixed-length drafts at it. Python's memory plan reads it as _core.ROLLBACK_DEPTH.
constexpr int kRollbackDepth = kAutoDraftMax;

struct EngineOptions {
    std::string target_path;
    // The drafter, decided by localspec's Python layer (localspec/runtime/loading.py,
    // core_drafter), which owns the spelling: "none", "ngram", "mtp" (n-gram, then the
    // target's MTP layers), "model" (the draft GGUF at drafter_path), "hybrid" (n-gram, then
    // that model), "head" (the EAGLE-3 head at drafter_path) or "eagle3" (n-gram, then that head).
    std::string drafter_kind = "ngram";
    std::string drafter_path;
    int n_ctx = 4096;
    int n_threads = 0;
    int n_gpu_layers_target = -1;
    int n_gpu_layers_draft = -1;
    std::vector<std::string> rpc;  // RPC workers for the target's layers (ModelOptions::rpc)
    bool draft_sampling = true;  // model drafter samples from q at temperature > 0
    int ngram_min = 2;
    int ngram_max = 4;
    // Tokens of recent outputs the n-gram drafter also looks up, shared across requests
    // (draft/recent_outputs.h); 0: off.
    int recent_ngram_tokens = 0;
    float draft_p_min = 0.4f;  // model drafter stops when its top probability falls below this
    // A draft model drafts among token ids below this alone (its head computes those rows:
    // ContextOptions::head_rows); 0: its whole vocabulary.
    int draft_vocab = 0;
    int controller_k_max = kAutoDraftMax;  // the longest draft the adaptive controller may choose
    // Logits from localspec's own output head (Q8_0 or Q6_K: q8_head.h, q6k_head.h) when possible
    // (target and draft).
    bool fast_head = true;
    // The target's body matrices of faster_body_types() multiplied by localspec's int8
    // kernels (body_matmul.h) where this CPU runs them, unless `repack` is off (the weights then keep
    // their file layout); exact mode puts every quantized matrix there.
    bool fast_body = true;
    std::string kv_type = "f16";  // KV cache type of both contexts (ggml's type name)
    // Exact mode (docs/exact.md): every target row gets the same logits bits whatever the
    // pass's row count, so speculative output equals plain output bit for bit. It overrides
    // repack and flash_attn, knobs that exist to measure them one by one.
    bool exact = false;
    bool repack = true;  // llama.cpp's repacked CPU weight layouts (target)
    int flash_attn = -1;  // -1 llama.cpp's choice, 0 off, 1 on (target)
    bool verbose = false;
    // Generations that share the target's passes (batched serving); 1: one at a time. More
    // than one needs a drafter that runs no model (n-gram or none) and no exact mode on an
    // F16 target (Context::n_seq).
    int n_seq = 1;
};

struct GenerateRequest {
    std::vector<Token> prompt;
    SamplingParams sampling;
    int max_tokens = 256;
    // The longest draft per step (0: plain decoding) and whether the controller picks k in
    // [0, draft_max] each step. GenerationParams owns the defaults ("auto"; localspec/runtime/
    // convert.py sets both); these are the same, for C++ callers.
    int draft_max = kAutoDraftMax;
    bool adaptive = true;
    bool ignore_eos = false;
    bool reuse_cache = true;  // keep the KV of a common prefix from the previous request
    std::vector<std::string> stop;
    std::string grammar;  // GBNF (root rule "root") the output must follow; "" = unconstrained
    // Seconds one mask of the whole vocabulary took for this grammar when it was checked (0:
    // unknown): fair turns start from it, before the generation's own steps show its cost.
    double grammar_mask_seconds = 0;
    int logprobs = -1;    // -1: none; n >= 0: each emitted token's log probability and the top n
    // Predicted Outputs: the client's own draft of the output (an edit's original text), which
    // the prediction drafter proposes from (prediction_drafter.h); empty: none. Output is the
    // target's whatever it says.
    std::vector<Token> prediction;
};

// What one step emitted, handed to the chunk callback.
struct Chunk {
    std::string text;
    std::vector<Token> tokens;
    std::vector<Provenance> provenance;
    const GenerationStats& stats;
    const std::vector<TokenLogprob>& logprobs;  // one per token when the request asked for them
};

// Return false to cancel the generation (it stops after the current step).
using ChunkCallback = std::function<bool(const Chunk&)>;

// What one engine step did (batched generation).
struct StepReport {
    std::vector<int> finished;  // ids of the generations that ended (SpecEngine::take_result)
    int sequences = 0;          // generations in the verification pass (0: none ran)
    int rows = 0;               // the pass's rows
    int emitted = 0;            // tokens it emitted, over all generations
    int prefilled = 0;          // prompt tokens prefilled before it
};

// What SpecEngine::replay_greedy found: the first emitted token that is not the target's
// argmax in the replay (-1: none), and how many of the schedule's passes it ran (all of them
// unless the tokens ran out first: it goes on past a mismatch).
struct ReplayOutcome {
    int first_mismatch = -1;
    int passes = 0;
};

struct GenerateResult {
    std::string text;
    std::vector<Token> tokens;
    std::vector<Provenance> provenance;
    std::string finish_reason;  // "stop", "length", "cancelled" or "error"
    // With finish_reason "error": the sentence saying why this generation alone failed, and
    // whether it was the request's own mistake (a UserError: its grammar cannot go on) or the
    // core's.
    std::string error;
    bool error_is_users = false;
    GenerationStats stats;
    // Per target pass: its rows (k + 1) and how many tokens it emitted (accepted + 1).
    std::vector<int> pass_rows, pass_emitted;
    std::vector<TokenLogprob> logprobs;  // one per token when the request asked for them
};

class SpecEngine {
public:
    explicit SpecEngine(const EngineOptions& options);
    ~SpecEngine();

    const Model& target() const { return *target_model_; }
    int n_ctx() const { return target_.n_ctx(); }
    // How many rejected draft tokens the target can take back (Context::rollback_depth): -1
    // any number; 0 none (a recurrent target without state snapshots: decode it plainly).
    int rollback_depth() const { return target_.rollback_depth(); }
    std::string drafter_name() const { return drafter_ ? drafter_->name() : "none"; }
    std::string verify_head() const { return target_.batch_head(); }
    std::string draft_head() const { return drafter_ ? drafter_->head() : ""; }
    std::string last_logits_head() const { return target_.last_head(); }
    bool exact() const { return exact_; }

    // One generation from start to end (others already started share its passes).
    GenerateResult generate(const GenerateRequest& request, const ChunkCallback& on_chunk);

    // Batched generation. start() checks a request and gives it a free cache slot (throws
    // UserError for a bad request, std::logic_error when every slot is busy); step() prefills
    // new generations' prompts (in chunks while others run) and runs one speculative step for
    // every generation at once; take_result() hands over a finished one's result.
    int start(const GenerateRequest& request, ChunkCallback on_chunk);
    StepReport step();
    GenerateResult take_result(int id);
    // End a generation now (finish reason "cancelled"; take_result() still hands it over).
    void cancel(int id);
    int n_seq() const { return target_.n_seq(); }
    int n_active() const { return static_cast<int>(sequences_.size()); }

    // Raw target logits for the token after `tokens`, computed as in plain decoding (the last
    // token decoded on its own), or, with batch_rows > 1, as row batch_rows-1 of a verification
    // batch over the last batch_rows tokens. Batched and single-row passes may differ in the
    // low bits; comparing the two tells a numerical tie from a real divergence.
    std::vector<float> next_token_logits(const std::vector<Token>& tokens, int batch_rows = 1);
    // Every row's logits ([row][n_vocab]) of one target pass over the last `rows` tokens.
    std::vector<float> pass_logits(const std::vector<Token>& tokens, int rows);

    // Median seconds of a greedy verification pass (decode, then the argmax of every row) over
    // the last r tokens of `context`, for r = 1 .. max_rows (index r; index 0 is 0), measured
    // `repeats` times each, the row counts taking turns so that drift hits all of them.
    std::vector<double> pass_seconds(const std::vector<Token>& context, int max_rows, int repeats);

    // Start-up calibration now, on `context` (any tokens), instead of in the first drafting
    // request: a server or chat warms up before its first answer. Nothing to do without a
    // drafter, once calibrated (or restored), or while a generation runs.
    void warm_up(const std::vector<Token>& context);

    // Replays a greedy generation with the same target batch shapes (pass_rows) from a clean
    // cache and finds the first token that is not the target's argmax there (shaped by the
    // request's penalties and grammar, as the step shapes it). A bug-free engine finds none:
    // same shapes, same numerics, same argmax. It runs every pass, past a mismatch, so that it
    // also times the same passes in another engine (bench --modes).
    ReplayOutcome replay_greedy(const std::vector<Token>& prompt, const std::vector<Token>& tokens,
                      const std::vector<int>& pass_rows, const std::vector<int>& pass_emitted,
                      const GenerateRequest& shaping);

    // What the controller has learned (acceptance by kind and position, pass and draft costs);
    // it carries over from request to request, and can be saved and restored.
    const ControllerMemory& controller_memory() const { return controller_.memory(); }
    void restore_controller_memory(const ControllerMemory& memory) { controller_.restore(memory); }

private:
    SpecEngine(const EngineOptions& options, const DrafterSpec& drafter);
    // The speculative step (speculative_step.cpp) and its parts, one generation each.
    void speculative_step(const std::vector<Sequence*>& batch);
    void draft(Sequence& s);
    Draft draft_tokens(Sequence& s, int k_cap);
    int choose_lookup(const Draft& draft);
    double draft_acceptance(const Draft& draft, size_t j) const;
    void fit_drafts_to_batch(const std::vector<Sequence*>& batch);
    double verify(const std::vector<Sequence*>& batch);
    void accept(Sequence& s);
    void roll_back(Sequence& s);
    void emit(Sequence& s, bool shared_pass);
    void finish(Sequence& s, const std::string& reason);
    void fail(Sequence& s, bool users, const std::string& what);
    std::vector<Sequence*> take_turns(const std::vector<Sequence*>& batch);
    void plan_turns(const std::vector<Sequence*>& batch, double step_seconds);
    static int sit_out_steps(double own_seconds, double others_seconds);
    template <class Work>
    std::vector<Sequence*> each_guarded(const std::vector<Sequence*>& batch, Work&& work);
    void resolve_unverified(Sequence& s);
    std::vector<TokenLogprob> step_logprobs(const Sequence& s, int n_top) const;
    // Generations joining and their slots (engine.cpp).
    int prefill_joining();
    bool slot_busy(int slot) const;  // a started generation holds it
    int choose_slot(const GenerateRequest& request) const;
    void forget_idle_slots(int chosen);
    void clear_slot(int slot);  // drop a slot's caches: the target's and the drafter's
    // The drafter, told which generation slot its next call concerns (Drafter::select); null
    // without one.
    Drafter* drafter_for(int slot);
    void check_request(const GenerateRequest& request) const;
    // The measuring tools and start-up measurements (engine_tools.cpp).
    int free_slot() const;  // for the measuring tools; throws while every slot is busy
    void calibrate(const std::vector<Token>& prompt, int slot);
    std::vector<double> pass_seconds_on(int slot, const std::vector<Token>& context, int max_rows, int repeats);
    void calibrate_batch(const std::vector<Token>& context, int slot);

    bool exact_ = false;
    std::shared_ptr<Model> target_model_;
    Context target_;
    // The latest generations' outputs, which the n-gram drafter also looks up (null: off).
    std::shared_ptr<RecentOutputs> recent_;
    std::unique_ptr<Drafter> drafter_;
    DraftController controller_;  // survives generations: costs are learned once
    PassCostCurve pass_cost_;     // seconds of a target pass by its total rows (batched passes)
    double last_step_seconds_ = 0;  // the last step's whole time (fair turns)
    long batched_passes_ = 0;     // passes shared by several generations so far (probe timing)
    std::vector<std::unique_ptr<Sequence>> sequences_;  // started, in arrival order
    int next_id_ = 1;
};

}  // namespace localspec
