// Creating, opening and validating a lane's shared-memory segment (see segment.h).
#include "peer/segment.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <thread>

#include "core/error.h"
#include "peer/sync.h"

namespace tandem::peer {

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

Segment::~Segment() {
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
}

std::shared_ptr<Segment> Segment::create(const std::string& lane, uint64_t fingerprint, const Geometry& g) {
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
  for (;;) {
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      if (errno != ENOENT) fail("lane {}: cannot open shared memory {}: {}", lane, name, errno_text());
      not_ready = fmt::format("no lane '{}' (shared memory {} does not exist)", lane, name);
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
