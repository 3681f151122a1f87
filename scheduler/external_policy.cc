#include "scheduler/external_policy.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "graph/graph_json.h"
#include "graph/status.h"
#include "graph/text_input.h"
#include "scheduler/budget.h"

extern char** environ;

namespace pebble {
namespace {

bool IsPolicyName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

class FunctionPlanner : public Planner {
 public:
  FunctionPlanner(std::string name, ScheduleFunction fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    ASSIGN_OR_RETURN(Schedule schedule, fn_(graph, options));
    absl::StatusOr<PlanResult> result = FinishPlan(graph, std::move(schedule), options);
    if (!result.ok()) {  // (named, as an exec: policy's: until 2026-12-05 it was not)
      return absl::InvalidArgumentError(absl::StrCat("policy ", Quote(name_),
                                                     ": its schedule is not valid: ",
                                                     result.status().message()));
    }
    return result;
  }

 private:
  std::string name_;
  ScheduleFunction fn_;
};

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Close(); }
  int get() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Runs `program` under /bin/sh -c in a process group of its own, feeding it
// `input` and collecting its stdout (at most kMaxJsonFileBytes), within
// `limit_s` seconds. Its output is what it wrote before it exited. However
// it ends (an exit, a failure, the time limit, too much output), the whole
// process group is killed before this returns: what the program left
// running in the background ends with it (a descendant that left the group,
// by setsid, is beyond reach). `who` ("exec:PROGRAM") begins every message.
absl::StatusOr<std::string> RunProgram(const std::string& program, const std::string& input,
                                       double limit_s, const std::string& who) {
  // The child's stdin is a socket, so that writing to a child that has
  // exited is EPIPE (MSG_NOSIGNAL), not a SIGPIPE for this process.
  int stdin_pair[2], stdout_pipe[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stdin_pair) != 0) {
    return Errno(absl::StrCat(who, ": socketpair"));
  }
  Fd to_child(stdin_pair[0]), child_stdin(stdin_pair[1]);
  if (pipe2(stdout_pipe, O_CLOEXEC) != 0) return Errno(absl::StrCat(who, ": pipe"));
  Fd from_child(stdout_pipe[0]), child_stdout(stdout_pipe[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_stdin.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, child_stdout.get(), STDOUT_FILENO);
  // Nothing else of this process: a rank's sockets (pebble run --ranks plans
  // after the ranks meet) would outlive a rank that is killed while it plans.
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t no_signals, default_signals;
  sigemptyset(&no_signals);
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGPIPE);  // a host that ignores it (Python) passes that on
  posix_spawnattr_setsigmask(&attr, &no_signals);
  posix_spawnattr_setsigdefault(&attr, &default_signals);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  std::string sh = "sh", dash_c = "-c", command = program;
  char* argv[] = {sh.data(), dash_c.data(), command.data(), nullptr};
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat(who, ": cannot start /bin/sh: ",
                                            std::strerror(spawned)));
  }
  child_stdin.Close();
  child_stdout.Close();

  // From here on, every way out kills the program's whole process group:
  // a child it started in the background (a server, a `sleep &`) must not
  // outlive the plan. The group is killed before the program itself is
  // reaped, so that its id cannot have been reused by then.
  bool reaped = false;
  struct GroupKiller {
    pid_t pid;
    bool* reaped;
    ~GroupKiller() {
      if (*reaped) return;
      kill(-pid, SIGKILL);
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    }
  } killer{pid, &reaped};
  if (fcntl(from_child.get(), F_SETFL, fcntl(from_child.get(), F_GETFL) | O_NONBLOCK) != 0) {
    return Errno(absl::StrCat(who, ": fcntl"));
  }

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const double limit = std::isfinite(limit_s) ? std::min(limit_s, 86400.0) : 86400.0;
  auto remaining_ms = [&] {
    const double left = limit - std::chrono::duration<double>(Clock::now() - start).count();
    return left <= 0 ? 0 : static_cast<int>(std::min(left * 1e3 + 1, 1e9));
  };

  std::string output;
  // Reads what the pipe holds now; false once it is at its end.
  absl::Status read_status;
  auto read_available = [&]() -> bool {
    char buffer[1 << 16];
    for (;;) {
      const ssize_t n = read(from_child.get(), buffer, sizeof buffer);
      if (n > 0) {
        output.append(buffer, static_cast<size_t>(n));
        if (static_cast<int64_t>(output.size()) > kMaxJsonFileBytes) {
          read_status = absl::InvalidArgumentError(absl::StrCat(
              who, ": wrote more than ", kMaxJsonFileBytes, " bytes; the program was killed"));
          return false;
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && errno == EAGAIN;
    }
  };
  // The program has exited: waitid's WNOWAIT leaves it a zombie, so that
  // its process group id stays reserved until the group is killed.
  int lost = 0;  // waitid's errno when the program cannot be waited for
  auto exited = [&] {
    siginfo_t info;
    info.si_pid = 0;
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno != EINTR) lost = errno;
      return lost != 0;
    }
    return info.si_pid == pid;
  };

  size_t written = 0;
  bool writing = true, reading = true;
  for (;;) {
    const int wait_ms = remaining_ms();
    if (wait_ms == 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          who, reading ? ": no schedule within the time limit of "
                       : ": did not exit within the time limit of ",
          limit_s, " s; the program was killed"));
    }
    // The program's end is checked every 10 ms: a child left in the
    // background may hold its stdout open, so the pipe's end is not the
    // program's.
    pollfd fds[2] = {{from_child.get(), POLLIN, 0}, {to_child.get(), POLLOUT, 0}};
    pollfd* first = reading ? &fds[0] : &fds[1];
    const nfds_t count = (reading ? 1 : 0) + (writing ? 1 : 0);
    const int ready = poll(count > 0 ? first : nullptr, count, std::min(wait_ms, 10));
    if (ready < 0 && errno != EINTR) return Errno(absl::StrCat(who, ": poll"));
    if (writing && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      const ssize_t n = send(to_child.get(), input.data() + written, input.size() - written,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) written += static_cast<size_t>(n);
      // EPIPE: the program does not read all of its input, which is its choice.
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        writing = false;
        to_child.Close();  // end of input
      }
    }
    if (reading && (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
      reading = read_available();
      if (!read_status.ok()) return read_status;
    }
    if (exited()) {
      // What it wrote before exiting is in the pipe: its output ends there.
      // What it left running goes first, so that nothing more is written.
      kill(-pid, SIGKILL);
      if (reading) read_available();
      if (!read_status.ok()) return read_status;
      break;
    }
  }
  if (lost != 0) {
    errno = lost;
    return Errno(absl::StrCat(who, ": waitid"));
  }
  kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  reaped = true;
  if (WIFSIGNALED(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": the program was killed by signal ", WTERMSIG(status)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": the program exited with status ", WEXITSTATUS(status), " (its stderr is above)"));
  }
  return output;
}

class ExecPlanner : public Planner {
 public:
  explicit ExecPlanner(std::string program) : program_(std::move(program)) {}
  absl::StatusOr<PlanResult> Plan(const Graph& graph,
                                  const PlannerOptions& options) const override {
    const std::string who = absl::StrCat(kExecPolicyPrefix, program_);
    ASSIGN_OR_RETURN(std::string output,
                     RunProgram(program_, ExecPolicyInput(graph, options).dump() + "\n",
                                options.time_limit_s, who));
    if (output.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": wrote nothing on stdout (a pebble-schedule JSON document was expected)"));
    }
    bool json_error = false;
    absl::StatusOr<Schedule> schedule =
        ParseScheduleText(graph, output, "its output", &json_error);
    if (!schedule.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": ", schedule.status().message(),
                       json_error ? " (a pebble-schedule JSON document was expected)" : ""));
    }
    absl::StatusOr<PlanResult> result = FinishPlan(graph, *std::move(schedule), options);
    if (!result.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": its schedule is not valid: ", result.status().message()));
    }
    return result;
  }

 private:
  std::string program_;
};

}  // namespace

absl::Status RegisterExternalPolicy(const std::string& name, const std::string& description,
                                    PlanKind kind, ScheduleFunction fn) {
  if (!IsPolicyName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy name ", Quote(name),
        " must be 1 to 64 letters, digits, '-', '_' or '.' (exec:PROGRAM names a program)"));
  }
  if (!fn) {
    return absl::InvalidArgumentError(absl::StrCat("policy ", Quote(name), " has no function"));
  }
  PolicyInfo info;
  info.name = name;
  info.description = description.empty() ? "registered from outside pebble" : description;
  info.kind = kind;
  info.factory = [name, fn = std::move(fn)] {
    return std::make_unique<FunctionPlanner>(name, fn);
  };
  return PlannerRegistry::Global().RegisterExternal(std::move(info));
}

absl::Status UnregisterExternalPolicy(const std::string& name) {
  return PlannerRegistry::Global().UnregisterExternal(name);
}

nlohmann::ordered_json PolicyOptionsJson(const PlannerOptions& options) {
  const bool min = options.budget_bytes == kMinBudgetBytes;
  nlohmann::ordered_json o;
  o["budget_bytes"] = min ? nlohmann::ordered_json(nullptr)
                          : nlohmann::ordered_json(options.budget_bytes);
  o["min_budget"] = min;
  o["host_budget_bytes"] = options.host_budget_bytes
                               ? nlohmann::ordered_json(*options.host_budget_bytes)
                               : nlohmann::ordered_json(nullptr);
  o["host_bandwidth_bytes_per_s"] = options.host_bandwidth_bytes_per_s;
  o["time_limit_s"] = options.time_limit_s;
  o["seed"] = options.seed;
  return o;
}

nlohmann::ordered_json ExecPolicyInput(const Graph& graph, const PlannerOptions& options) {
  nlohmann::ordered_json doc;
  doc["format"] = "pebble-policy-input";
  doc["version"] = 1;
  doc["graph"] = GraphToJson(graph);
  doc["options"] = PolicyOptionsJson(options);
  return doc;
}

std::unique_ptr<Planner> MakeExecPlanner(std::string program) {
  return std::make_unique<ExecPlanner>(std::move(program));
}

}  // namespace pebble
