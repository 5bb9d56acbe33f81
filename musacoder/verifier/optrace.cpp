// The op trace at the dispatcher (trusted harness code, see legality.py): a global RecordFunction callback, which
// c10::Dispatcher::call runs for every op whatever dispatch keys are excluded, so ops that native code or a Python
// callable under an ExcludeDispatchKeyGuard runs are seen too. Loaded with ctypes into subject processes; a C API.
//
// Which calls count. An op is counted where the candidate called it: at the top of a thread's op stack, or inside one
// of the candidate's own ops (outside PyTorch's namespaces), or inside a CompositeImplicitAutograd op (which
// decomposes before any kernel runs, as the Python dispatch key saw it). Inside an allowlisted op only ops that are
// neither allowlisted nor a helper of theirs (random fills, cross-device copies) count: an allowlisted op's
// own internals (aten::zeros runs aten::empty and aten::zero_) are not the candidate's, while compute reached there
// through a kernel, fallback or Python handler the candidate registered is. Inside any other PyTorch op nothing more
// counts: that op is refused already (so a window where nothing counts inside an op holds a refused op). Contexts
// only get stricter with depth, so a RecordFunction the candidate starts or ends out of order can make more calls
// count, never fewer.
//
// Cost per op: a thread-local cache lookup keyed by the op schema's name pointer (stable while the op is registered;
// a deregistration flushes the caches), one relaxed atomic increment, a push and a pop on a thread-local stack. Names
// are resolved once per op, under a lock.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <unistd.h>

namespace {

enum Kind : uint8_t {
  kLabel,      // a RecordFunction named by a string (RECORD_FUNCTION labels), not an op: transparent, not counted
  kOwn,        // an op outside PyTorch's namespaces (TORCH_LIBRARY): transparent, counted
  kComposite,  // CompositeImplicitAutograd on every backend: transparent, not counted
  kAllowed,    // an allowlisted op, or a helper allowlisted ops call: what it calls is judged
  kTorch,      // any other PyTorch op: counted (and refused); what it calls is not
  kForged,     // a RecordFunction whose schema is not the dispatcher's: transparent, counted
};
const char* const kKindNames[] = {"label", "own", "composite", "allowed", "torch", "forged"};
// What encloses a call: nothing but transparent frames, an allowlisted op, another PyTorch op.
enum Ctx : uint8_t { kTop, kInAllowed, kInTorch };

constexpr int kMaxSlots = 1 << 14;
constexpr int kMaxDepth = 1024;
constexpr int kCache = 256;

struct Slot {
  std::string name, overload;
  Kind kind;
};

std::mutex mu;  // guards what follows but the atomics
std::vector<std::unique_ptr<Slot>> slots;     // slot 0: ops past kMaxSlots, counted as a refused op
std::unordered_map<const char*, int> by_key;  // schema name pointer -> slot
std::unordered_set<std::string> torch_ns;     // "aten", "prims", ...
std::unordered_set<std::string> allowed;      // "aten::empty", ..., and the helpers
std::atomic<uint8_t> kinds[kMaxSlots];
std::atomic<uint64_t> counts[kMaxSlots];
// high half: the window (start() resets every thread's stack), low half: the cache generation (a deregistration)
std::atomic<uint64_t> stamp{1ull << 32};
at::CallbackHandle handle = 0;  // the open window's callback
uint64_t window = 0;            // the open (or last) window's token
pid_t configured_pid = 0;

struct Tls {  // trivial, so zero-initialised without a guard on every access
  uint64_t stamp;
  int32_t depth;
  uint8_t ctx[kMaxDepth + 1];  // ctx[d]: what encloses a call made at depth d
  struct {
    const char* key;
    int32_t slot;
  } cache[kCache];
};
thread_local Tls tls;

bool composite(const c10::OperatorHandle& h) {
  // the computed dispatch table of the runtime keys subjects call ops with: CompositeImplicitAutograd's on all
  static const std::string_view keys[] = {"CPU: ", "CUDA: ", "PrivateUse1: ", "AutogradCPU: ", "AutogradCUDA: ",
                                          "AutogradPrivateUse1: "};
  const std::string table = h.dumpComputedTable();
  std::string_view rest(table);
  bool any = false;
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    for (auto k : keys) {
      if (line.substr(0, k.size()) == k) {
        if (line.find("[math kernel]") == std::string_view::npos) return false;
        any = true;
      }
    }
  }
  return any;
}

Kind classify(const at::RecordFunction& fn, const char* key, Slot& s) {
  std::optional<c10::OperatorName> op = fn.operator_name();
  if (!op) return kLabel;
  s.name = op->name;
  s.overload = op->overload_name;
  auto h = c10::Dispatcher::singleton().findSchema(*op);
  if (!h || h->schema().name().c_str() != key) return kForged;
  if (!torch_ns.count(op->name.substr(0, op->name.find("::")))) return kOwn;
  if (composite(*h)) return kComposite;
  return allowed.count(op->name) ? kAllowed : kTorch;
}

// The op's slot, or -1 for a label: a label's name lives in its RecordFunction, so it is never cached.
int resolve(const at::RecordFunction& fn, const char* key) {
  std::lock_guard<std::mutex> g(mu);
  auto it = by_key.find(key);
  if (it != by_key.end()) return it->second;
  auto s = std::make_unique<Slot>();
  Kind k = classify(fn, key, *s);
  if (k == kLabel) return -1;
  if ((int)slots.size() >= kMaxSlots) return 0;
  s->kind = k;
  int i = (int)slots.size();
  slots.push_back(std::move(s));
  kinds[i].store(k, std::memory_order_relaxed);
  by_key.emplace(key, i);
  return i;
}

inline Tls& current() {
  Tls& t = tls;
  uint64_t s = stamp.load(std::memory_order_relaxed);
  if (t.stamp != s) {
    if (t.stamp >> 32 != s >> 32) {
      t.depth = 0;
      t.ctx[0] = kTop;
    }
    std::memset(t.cache, 0, sizeof(t.cache));
    t.stamp = s;
  }
  return t;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Tls& t = current();
  const char* key = fn.name();
  uint32_t h = (uint32_t)(((uintptr_t)key >> 3) ^ ((uintptr_t)key >> 12)) & (kCache - 1);
  auto& e = t.cache[h];
  int s = e.key == key ? e.slot : resolve(fn, key);
  if (s >= 0) e = {key, s};
  Kind k = s < 0 ? kLabel : (Kind)kinds[s].load(std::memory_order_relaxed);
  uint8_t c = t.ctx[t.depth < kMaxDepth ? t.depth : kMaxDepth];
  bool counted = c == kTop ? k != kComposite && k != kLabel : c == kInAllowed && (k == kOwn || k == kTorch || k == kForged);
  if (counted) counts[s].fetch_add(1, std::memory_order_relaxed);
  uint8_t inner = k == kAllowed ? (c == kInTorch ? kInTorch : kInAllowed) : k == kTorch ? kInTorch : c;
  if (++t.depth <= kMaxDepth) t.ctx[t.depth] = inner;
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  Tls& t = current();
  if (t.depth > 0) --t.depth;  // an end without its start (a window opened mid-op) is dropped
}

// A deregistered op's schema is freed, and its name pointer may come back as another op's.
struct Forget final : c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle& op) override {
    std::lock_guard<std::mutex> g(mu);
    by_key.erase(op.schema().name().c_str());
    stamp.fetch_add(1);
  }
};

std::vector<std::string> lines(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (; s && *s; ++s) {
    if (*s != '\n') {
      cur += *s;
    } else if (!cur.empty()) {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace

// The C API. Only the harness holds a window's token (a secret drawn per window): code that reaches these functions
// some other way can neither close nor read a window it did not open, nor configure a process twice.
extern "C" {

// PyTorch's op namespaces and the allowlisted ops with their helpers ("aten::empty"), one a line. Once per process
// (a forked child configures its own), before any candidate code runs. -1: configured already.
int musacoder_optrace_configure(const char* namespaces, const char* allowed_ops) {
  static auto* listener = new c10::RegistrationHandleRAII(  // for the process's lifetime: never destroyed
      c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<Forget>()));
  (void)listener;
  std::lock_guard<std::mutex> g(mu);
  if (configured_pid == getpid() || handle) return -1;
  configured_pid = getpid();
  torch_ns.clear();
  allowed.clear();
  for (auto& n : lines(namespaces)) torch_ns.insert(n);
  for (auto& n : lines(allowed_ops)) allowed.insert(n);
  slots.clear();
  slots.push_back(std::make_unique<Slot>(Slot{"aten::<more ops than the trace holds>", "", kTorch}));
  kinds[0].store(kTorch);
  by_key.clear();
  stamp.fetch_add(1);
  return 0;
}

// Opens a window: counts zeroed, the callback added for every thread (FUNCTION scope: dispatcher ops and labels).
int musacoder_optrace_start(uint64_t token) {
  std::lock_guard<std::mutex> g(mu);
  if (handle || configured_pid != getpid() || !token) return -1;
  for (size_t i = 0; i < slots.size(); ++i) counts[i].store(0, std::memory_order_relaxed);
  stamp.fetch_add(1ull << 32);
  window = token;
  handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_start, &on_end).scopes({at::RecordScope::FUNCTION}));
  return 0;
}

int musacoder_optrace_stop(uint64_t token) {
  std::lock_guard<std::mutex> g(mu);
  if (!handle || token != window) return -1;
  at::removeCallback(handle);
  handle = 0;
  return 0;
}

// The last window's counts, one op a line: "count\tkind\tname\toverload\n". Returns the bytes needed (with the
// terminating NUL), -1 for a wrong token or an open window; writes them only when they fit in `cap`.
long musacoder_optrace_read(uint64_t token, char* buf, long cap) {
  std::string out;
  {
    std::lock_guard<std::mutex> g(mu);
    if (handle || token != window) return -1;
    for (size_t i = 0; i < slots.size(); ++i) {
      uint64_t n = counts[i].load(std::memory_order_relaxed);
      if (n) {
        out += std::to_string(n) + "\t" + kKindNames[slots[i]->kind] + "\t" + slots[i]->name + "\t" +
               slots[i]->overload + "\n";
      }
    }
  }
  if ((long)out.size() < cap) std::memcpy(buf, out.c_str(), out.size() + 1);
  return (long)out.size() + 1;
}

}  // extern "C"
