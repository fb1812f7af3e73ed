// The split lane's cut (see split.h).
#include "runtime/split.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/bandwidth.h"
#include "core/error.h"
#include "moe/experts.h"
#include "peer/client.h"
#include "runtime/lane.h"
#ifdef TANDEM_HAVE_CUDA
#include "backends/cuda/cuda_engine.h"
#endif

namespace tandem {

std::optional<double> parse_split_share(const std::string& value) {
  if (value == "auto") return std::nullopt;
  double share = 0;
  size_t used = 0;
  try {
    share = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || !(share > 0.0 && share < 1.0))
    fail("--split-share {}: give a share of each cold expert's features in (0, 1), or auto", value);
  return share;
}

void check_split_share(double share) {
  if (!(share > 0.0 && share < 1.0))
    fail("--split-share {}: give a share of each cold expert's features in (0, 1), or auto", share);
}

int64_t resolve_split_column(std::optional<double> share, const std::string& peer, int64_t inter, double timeout_s) {
  if (share) return split_column(inter, *share);
  const peer::Geometry g = peer::peek_geometry(peer, timeout_s);
  if (g.split_column == 0)
    fail("lane {}: its peer computes whole cold experts (the peer lane); the split lane needs a `tandem peer "
         "--split-share F|auto`",
         peer);
  if (int64_t(g.split_column) >= inter)
    fail("lane {}: its peer cuts the experts at feature {}, but they have {} intermediate features", peer,
         g.split_column, inter);
  spdlog::info("split lane: the peer of lane {} cuts each cold expert at feature {} of {}: {:.2f} of it over PCIe",
               peer, g.split_column, inter, double(g.split_column) / double(inter));
  return int64_t(g.split_column);
}

int64_t choose_peer_split(const PeerSplitOptions& o, bool on_gpu, int64_t inter, ThreadPool& pool) {
  if (o.share.empty() || o.share == "0") return 0;
  std::optional<double> share = parse_split_share(o.share);
  if (!share) {
    if (on_gpu)
      fail("--split-share auto weighs the link against this host's DRAM; a peer on --device cuda takes --split-share F");
    double link = o.link_gbps, dram = o.dram_gbps;
    std::string link_from = "--link-gbps", dram_from = "--dram-gbps";
    if (link == 0) {
#ifdef TANDEM_HAVE_CUDA
      const std::optional<int> dev = parse_cuda_index(o.link_device);
      if (!dev) fail("--link-device {}: name the primary's GPU (cuda or cuda:N)", o.link_device);
      if (*dev >= cuda_device_count())
        fail("--split-share auto: no GPU {} (--link-device) to measure the link from ({} CUDA device(s) found); "
             "give --link-gbps G or --split-share F",
             o.link_device, cuda_device_count());
      link = cuda_host_read_bandwidth_gbps(*dev);
      cuda_release_device(*dev);  // a CPU peer: its context would hold GPU memory the primary may need
      link_from = fmt::format("measured: cuda:{} reading pinned host memory", *dev);
#else
      fail("--split-share auto measures the link from the primary's GPU and this build has no CUDA backend: give "
           "--link-gbps G or --split-share F");
#endif
    }
    if (dram == 0) {
      dram = dram_read_bandwidth_gbps(pool);
      dram_from = fmt::format("measured: {} threads", pool.size());
    }
    share = split_share_for(link, dram);
    spdlog::info("peer: split share auto: link {:.1f} GB/s ({}), DRAM {:.1f} GB/s ({}): {:.3f} of each cold expert "
                 "over the link",
                 link, link_from, dram, dram_from, *share);
  }
  return split_column(inter, *share);
}

}  // namespace tandem
