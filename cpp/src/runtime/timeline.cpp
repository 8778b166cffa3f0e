// Timeline: per-thread event tracks, a critical-path summary, Chrome trace JSON.
#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "swiftspec/error.h"
#include "swiftspec/timeline.h"

namespace swiftspec {

namespace ev = timeline_event;

void TimelineTrack::add(const char* event, double begin, double end, int round,
                        std::vector<std::pair<std::string, long long>> args) {
  TimelineEvent e;
  e.name = event;
  e.begin = begin;
  e.end = std::max(begin, end);
  e.round = round;
  e.args = std::move(args);
  events.push_back(std::move(e));
}

double TimelineTrack::total(const std::string& event) const {
  double t = 0;
  for (const auto& e : events)
    if (e.name == event) t += e.end - e.begin;
  return t;
}

int TimelineTrack::count(const std::string& event) const {
  return static_cast<int>(std::count_if(events.begin(), events.end(), [&](const auto& e) { return e.name == event; }));
}

void Timeline::start() {
  tracks_.clear();
  t0_ = Clock::now();
}

TimelineTrack& Timeline::track(const std::string& name) {
  for (auto& t : tracks_)
    if (t.name == name) return t;
  tracks_.push_back(TimelineTrack{name, {}});
  return tracks_.back();
}

const TimelineTrack* Timeline::find(const std::string& name) const {
  for (const auto& t : tracks_)
    if (t.name == name) return &t;
  return nullptr;
}

TimelineSummary Timeline::summary() const {
  TimelineSummary s;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (const auto& t : tracks_)
    for (const auto& e : t.events) {
      first = std::min(first, e.begin);
      last = std::max(last, e.end);
    }
  if (last > first) s.span = last - first;
  double v0 = std::numeric_limits<double>::infinity(), v1 = 0;
  if (const TimelineTrack* t = find("target")) {
    for (const auto& e : t->events)
      if (e.name == ev::kVerify) {
        v0 = std::min(v0, e.begin);
        v1 = std::max(v1, e.end);
        s.target_verify += e.end - e.begin;
        ++s.rounds;
      }
    // Waits that delayed a verification: those after the first one started.
    for (const auto& e : t->events)
      if (e.name == ev::kWaitSubtree && e.begin >= v0) s.target_wait += e.end - e.begin;
  }
  if (v1 > v0) s.decode_span = v1 - v0;
  if (const TimelineTrack* t = find("draft")) {
    for (const auto& e : t->events) {
      const double d = e.end - e.begin;
      if (e.name == ev::kGrow)
        s.draft_grow += d;
      else if (e.name == ev::kSend || e.name == ev::kReroot)
        s.draft_other += d;
      else if (e.name == ev::kWaitResult)
        s.draft_wait += d;
    }
  }
  return s;
}

std::string Timeline::to_chrome_trace() const {
  using json = nlohmann::json;
  json events = json::array();
  int tid = 1;
  for (const auto& t : tracks_) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", tid}, {"args", {{"name", t.name}}}});
    events.push_back(
        {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 1}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    for (const auto& e : t.events) {
      json args = json::object();
      if (e.round >= 0) args["round"] = e.round;
      for (const auto& [k, v] : e.args) args[k] = v;
      events.push_back({{"name", e.name},
                        {"cat", t.name},
                        {"ph", "X"},
                        {"pid", 1},
                        {"tid", tid},
                        {"ts", e.begin * 1e6},
                        {"dur", (e.end - e.begin) * 1e6},
                        {"args", args}});
    }
    ++tid;
  }
  json out;
  out["traceEvents"] = events;
  out["displayTimeUnit"] = "ms";
  const TimelineSummary s = summary();
  out["otherData"] = {{"span_s", s.span},
                      {"decode_span_s", s.decode_span},
                      {"target_verify_s", s.target_verify},
                      {"target_wait_s", s.target_wait},
                      {"draft_grow_s", s.draft_grow},
                      {"draft_wait_s", s.draft_wait},
                      {"rounds", s.rounds},
                      {"target_utilization", s.target_utilization()}};
  return out.dump();
}

void Timeline::save_chrome_trace(const std::string& path) const {
  std::ofstream f(path);
  if (!f) throw InvalidArgument("cannot write the Chrome trace to '" + path + "'");
  f << to_chrome_trace();
  if (!f) throw InvalidArgument("error while writing the Chrome trace to '" + path + "'");
}

}  // namespace swiftspec
