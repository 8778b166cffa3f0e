// A per-request timeline of the asynchronous engine: what each worker group
// (and the host thread that streams tokens) did when — draft steps,
// verifications, re-roots, and the waits for messages between them. It shows
// whether the draft is off the critical path (SwiftSpec ASPLOS'26 §4.1: "the
// target never waits for the draft if the tree is deep enough"), and can be
// written as Chrome trace JSON (open in chrome://tracing or ui.perfetto.dev).
//
// Recording is lock-free: each track (one per thread) is written by one
// thread only; read the timeline after the threads are joined. Times are
// seconds since the request started (Timeline::start()).
#pragma once
#include <chrono>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace swiftspec {

/// Event names used by the asynchronous engine (tracks "draft", "target", "host").
namespace timeline_event {
inline constexpr const char* kPrefill = "prefill";           ///< draft/target: prompt processing
inline constexpr const char* kVerify = "verify";             ///< target: one tree verification (forward + commit)
inline constexpr const char* kWaitSubtree = "wait_subtree";  ///< target idle: waiting for the next subtree
inline constexpr const char* kGrow = "grow";                 ///< draft: one draft forward pass (tree expansion)
inline constexpr const char* kSend = "select_send";          ///< draft: best subtree selected and sent
inline constexpr const char* kReroot = "reroot";             ///< draft: commit the accepted path, re-root the tree
inline constexpr const char* kWaitResult = "wait_result";    ///< draft idle: waiting for a verification result
inline constexpr const char* kEmit = "emit";                 ///< host: streaming callback with new tokens
}  // namespace timeline_event

struct TimelineEvent {
  std::string name;  ///< one of timeline_event (or any label)
  double begin = 0;  ///< seconds since Timeline::start()
  double end = 0;    ///< seconds since Timeline::start(), >= begin
  int round = -1;    ///< verification round the event belongs to (-1: none)
  /// Integer annotations (e.g. {"nodes", 16}, {"accepted", 3}).
  std::vector<std::pair<std::string, long long>> args;
};

/// One thread's events, in time order.
struct TimelineTrack {
  std::string name;  ///< "draft", "target", "host"
  std::vector<TimelineEvent> events;

  /// Appends an event [begin, end] (seconds since start).
  void add(const char* event, double begin, double end, int round = -1,
           std::vector<std::pair<std::string, long long>> args = {});
  /// Total seconds of the events named `event`.
  double total(const std::string& event) const;
  /// Number of events named `event`.
  int count(const std::string& event) const;
};

/// What the timeline says about the critical path (seconds).
struct TimelineSummary {
  double span = 0;           ///< first event begin .. last event end
  double decode_span = 0;    ///< first verification begin .. last verification end
  double target_verify = 0;  ///< target busy verifying
  double target_wait = 0;    ///< target idle waiting for a subtree, after its first verification
  double draft_grow = 0;     ///< draft busy in forward passes (decode phase)
  double draft_other = 0;    ///< draft busy selecting / re-rooting
  double draft_wait = 0;     ///< draft idle waiting for a result (nothing left to grow)
  int rounds = 0;            ///< verifications
  /// Share of the decode span the target spent verifying (1.0: the draft is
  /// entirely off the critical path).
  double target_utilization() const { return decode_span > 0 ? target_verify / decode_span : 0.0; }
};

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  /// Clears the tracks and sets time zero to now.
  void start();
  /// Seconds since start().
  double now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  /// Adds (or returns) the track `name`. Create every track before the
  /// threads that write them start (adding is not thread-safe); the returned
  /// reference stays valid until start() or destruction.
  TimelineTrack& track(const std::string& name);
  const std::deque<TimelineTrack>& tracks() const { return tracks_; }
  /// The track `name`, or nullptr.
  const TimelineTrack* find(const std::string& name) const;

  TimelineSummary summary() const;
  /// Chrome trace JSON ({"traceEvents": [...]}, complete "X" events in
  /// microseconds, one thread per track, a metadata name per thread).
  std::string to_chrome_trace() const;
  /// Writes to_chrome_trace() to `path`; throws InvalidArgument if the file
  /// cannot be written.
  void save_chrome_trace(const std::string& path) const;

 private:
  Clock::time_point t0_ = Clock::now();
  std::deque<TimelineTrack> tracks_;  // a deque: references stay valid as tracks are added
};

}  // namespace swiftspec
