// Creating, opening and validating a lane's shared-memory segment (see segment.h).
#include "peer/segment.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <thread>

#include "core/error.h"
#include "peer/sync.h"

namespace tandem::peer {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Segment mappings the SIGBUS handler knows. A SIGBUS inside one means its file was truncated under
// us: the handler maps anonymous zero pages over the mapping from the faulting page on (pages before
// it, still backed by the file, stay shared) and marks the entry, so the access completes and the
// lane loops see shrunk(). Chosen over siglongjmp because the faulting access may be on any thread
// (the peer's compute workers read the slots), where no jump target exists; the zero pages make every
// such access harmless, and no answer computed after it is published (the loops check first).
struct BusEntry {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> hit{false};
};
constexpr int kBusEntries = 16;
BusEntry g_bus[kBusEntries];
std::atomic<bool> g_bus_installed{false};
std::atomic<uintptr_t> g_page_bytes{4096};
struct sigaction g_bus_previous {};

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (BusEntry& e : g_bus) {
    const uintptr_t b = e.begin.load(std::memory_order_acquire), end = e.end.load(std::memory_order_acquire);
    if (b == 0 || addr < b || addr >= end) continue;
    const uintptr_t page = g_page_bytes.load(std::memory_order_relaxed);
    const uintptr_t from = std::max(b, addr & ~(page - 1));
    if (mmap(reinterpret_cast<void*>(from), end - from, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
             -1, 0) != MAP_FAILED) {
      e.hit.store(true, std::memory_order_release);
      return;  // the access is retried on the zero page
    }
    break;
  }
  // Not ours (or the header page itself is gone): what would have happened without us.
  if (g_bus_previous.sa_flags & SA_SIGINFO) {
    if (g_bus_previous.sa_sigaction) return g_bus_previous.sa_sigaction(sig, info, ctx);
  } else if (g_bus_previous.sa_handler != SIG_DFL && g_bus_previous.sa_handler != SIG_IGN) {
    return g_bus_previous.sa_handler(sig);
  }
  signal(SIGBUS, SIG_DFL);  // returning re-runs the access, which now dies as it would have
}

int register_bus_range(uint8_t* base, uint64_t bytes) {
  bool expected = false;
  if (g_bus_installed.compare_exchange_strong(expected, true)) {
    g_page_bytes.store(uintptr_t(sysconf(_SC_PAGESIZE)), std::memory_order_relaxed);
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, &g_bus_previous);
  }
  for (int i = 0; i < kBusEntries; ++i) {
    uintptr_t zero = 0;
    if (g_bus[i].begin.compare_exchange_strong(zero, 1)) {  // reserve, then publish the range
      g_bus[i].hit.store(false, std::memory_order_relaxed);
      g_bus[i].end.store(reinterpret_cast<uintptr_t>(base) + bytes, std::memory_order_relaxed);
      g_bus[i].begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
      return i;
    }
  }
  return -1;  // table full: this mapping relies on the fstat check alone
}

}  // namespace

Segment::~Segment() {
  if (bus_slot_ >= 0) {
    g_bus[bus_slot_].end.store(0, std::memory_order_relaxed);
    g_bus[bus_slot_].begin.store(0, std::memory_order_release);
  }
  if (base_) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

void Segment::map(int fd, uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("shared memory {}: mmap of {} bytes failed: {}", name_, bytes, errno_text());
  base_ = static_cast<uint8_t*>(p);
  bytes_ = bytes;
  header_ = reinterpret_cast<Header*>(base_);
  struct stat st {};
  fstat(fd, &st);
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  bus_slot_ = register_bus_range(base_, bytes_);
}

bool Segment::faulted() const { return bus_slot_ >= 0 && g_bus[bus_slot_].hit.load(std::memory_order_acquire); }

bool Segment::shrunk() const {
  if (faulted()) return true;
  struct stat st {};
  return fstat(fd_, &st) == 0 && uint64_t(st.st_size) < bytes_;
}

void Segment::trip(TripCause cause, const std::string& reason) {
  Header& h = *header_;
  uint32_t unclaimed = 0;
  if (h.trip_claim.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel))
    write_bounded(h.trip_reason, kReasonBytes, reason);
  h.trip_cause.store(uint32_t(cause), std::memory_order_relaxed);
  h.state.store(uint32_t(LaneState::kTripped), std::memory_order_release);
  futex_wake_all(&h.doorbell);
  for (uint32_t i = 0; i < geometry_.n_slots; ++i) futex_wake_all_low(&slot(i).response->seq);
}

std::shared_ptr<Segment> Segment::create(const std::string& lane, uint64_t fingerprint, const Geometry& g,
                                         uint64_t rowmap_fp, uint64_t weights_fp) {
  std::string name = shm_name(lane);
  validate_geometry(g, fmt::format("lane {}", lane));
  const uint64_t bytes = segment_bytes(g);
  int fd = -1;
  for (int attempt = 0; attempt < 2 && fd < 0; ++attempt) {
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) break;
    if (errno != EEXIST) fail("shared memory {}: cannot create: {}", name, errno_text());
    // A leftover: replace it only when its peer is gone.
    std::shared_ptr<Segment> old;
    try {
      old = open(lane, 0.0);
    } catch (const InputError& e) {
      fail("lane {}: shared memory {} exists but is not a usable lane segment ({}); remove /dev/shm{} if no "
           "lane is running",
           lane, name, e.what(), name);
    }
    int32_t pid = old->header().peer_pid.load(std::memory_order_acquire);
    if (pid > 0 && process_state(pid) == ProcessState::kAlive)
      fail("lane {} is in use by a live peer (pid {})", lane, pid);
    spdlog::warn("lane {}: removing a leftover segment of a peer that is gone (pid {})", lane, pid);
    old->unlink_if_ours();
  }
  if (fd < 0) fail("shared memory {}: cannot create (it keeps reappearing)", name);
  auto seg = std::shared_ptr<Segment>(new Segment());
  seg->lane_ = lane;
  seg->name_ = name;
  seg->fd_ = fd;
  fchmod(fd, 0600);  // the umask may only have removed bits; make the mode exact
  if (ftruncate(fd, off_t(bytes)) != 0) {
    int err = errno;
    shm_unlink(name.c_str());
    fail("shared memory {}: cannot size to {} bytes: {}", name, bytes, std::strerror(err));
  }
  seg->map(fd, bytes);
  seg->geometry_ = g;
  seg->layout_ = slot_layout(g);
  seg->fingerprint_ = fingerprint;

  Header* h = new (seg->base_) Header();
  h->version = kProtocolVersion;
  h->header_bytes = kHeaderBytes;
  h->fingerprint = fingerprint;
  h->total_bytes = bytes;
  h->slot_bytes = seg->layout_.slot_bytes;
  h->geometry = g;
  h->peer_rowmap_fingerprint = rowmap_fp;
  h->peer_weights_fingerprint = weights_fp;
  h->state.store(uint32_t(LaneState::kStarting), std::memory_order_relaxed);
  h->peer_pid.store(int32_t(getpid()), std::memory_order_relaxed);
  h->peer_heartbeat_ns.store(now_ns(), std::memory_order_relaxed);
  for (uint32_t i = 0; i < g.n_slots; ++i) {
    uint8_t* s = seg->base_ + kHeaderBytes + uint64_t{i} * seg->layout_.slot_bytes;
    new (s + seg->layout_.request) RequestHead();
    new (s + seg->layout_.response) ResponseHead();
  }
  h->magic.store(kMagic, std::memory_order_release);
  return seg;
}

bool Segment::exists(const std::string& lane) {
  std::string name = shm_name(lane);
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

std::shared_ptr<Segment> Segment::open(const std::string& lane, double timeout_s) {
  std::string name = shm_name(lane);
  const uint64_t deadline = now_ns() + uint64_t(std::max(0.0, timeout_s) * 1e9);
  std::string not_ready;  // why the last look failed, for the error after the timeout
  bool told = false;      // the wait was logged
  for (;;) {
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      if (errno != ENOENT) fail("lane {}: cannot open shared memory {}: {}", lane, name, errno_text());
      not_ready = fmt::format("no lane '{}' (shared memory {} does not exist): start its peer first, `tandem peer "
                              "--lane {} --model M --rowmap R`",
                              lane, name, lane);
    } else {
      struct stat st {};
      if (fstat(fd, &st) != 0) {
        close(fd);
        fail("lane {}: fstat of {} failed: {}", lane, name, errno_text());
      }
      if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        close(fd);
        fail("lane {}: shared memory {} must be owned by uid {} with mode 0600 (found uid {}, mode {:o})", lane,
             name, geteuid(), st.st_uid, st.st_mode & 0777);
      }
      if (uint64_t(st.st_size) < kHeaderBytes) {
        close(fd);
        not_ready = fmt::format("lane {}: shared memory {} has {} bytes, less than its {}-byte header", lane, name,
                                st.st_size, kHeaderBytes);
      } else {
        auto seg = std::shared_ptr<Segment>(new Segment());
        seg->lane_ = lane;
        seg->name_ = name;
        seg->fd_ = fd;
        seg->map(fd, uint64_t(st.st_size));
        Header& h = *seg->header_;
        uint64_t magic = h.magic.load(std::memory_order_acquire);
        if (magic == 0) {
          not_ready = fmt::format("lane {}: shared memory {} is not initialised (magic 0)", lane, name);
        } else {
          if (magic != kMagic)
            fail("lane {}: shared memory {} is not a tandem lane (magic {:#x}, expected {:#x})", lane, name, magic,
                 kMagic);
          if (h.version != kProtocolVersion)
            fail("lane {}: protocol version {} in {}, this build speaks version {}", lane, h.version, name,
                 kProtocolVersion);
          if (h.header_bytes != kHeaderBytes)
            fail("lane {}: header_bytes is {}, expected {}", lane, h.header_bytes, kHeaderBytes);
          Geometry g = h.geometry;  // private copy, validated once
          validate_geometry(g, fmt::format("lane {} header", lane));
          SlotLayout layout = slot_layout(g);
          if (h.slot_bytes != layout.slot_bytes)
            fail("lane {}: header slot_bytes is {}, the geometry gives {}", lane, h.slot_bytes, layout.slot_bytes);
          if (h.total_bytes != segment_bytes(g) || uint64_t(st.st_size) != segment_bytes(g))
            fail("lane {}: segment size mismatch: header says {} bytes, file has {}, the geometry gives {}", lane,
                 h.total_bytes, st.st_size, segment_bytes(g));
          seg->geometry_ = g;
          seg->layout_ = layout;
          seg->fingerprint_ = h.fingerprint;
          return seg;
        }
      }
    }
    if (now_ns() >= deadline) fail("{}", not_ready);
    if (!told) {
      spdlog::info("lane {}: waiting up to {} s for its peer ({})", lane, timeout_s, not_ready);
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

SlotView Segment::slot(uint32_t i) {
  TANDEM_ASSERT(i < geometry_.n_slots, "slot {} out of range (n_slots {})", i, geometry_.n_slots);
  uint8_t* s = base_ + kHeaderBytes + uint64_t{i} * layout_.slot_bytes;
  SlotView v;
  v.request = reinterpret_cast<RequestHead*>(s + layout_.request);
  v.response = reinterpret_cast<ResponseHead*>(s + layout_.response);
  v.x = reinterpret_cast<float*>(s + layout_.x);
  v.ids = reinterpret_cast<int32_t*>(s + layout_.ids);
  v.weights = reinterpret_cast<float*>(s + layout_.weights);
  v.out = reinterpret_cast<float*>(s + layout_.out);
  return v;
}

bool Segment::still_linked() const {
  int fd = shm_open(name_.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  struct stat st {};
  bool same = fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  close(fd);
  return same;
}

bool Segment::unlink_if_ours() { return still_linked() && shm_unlink(name_.c_str()) == 0; }

}  // namespace tandem::peer
