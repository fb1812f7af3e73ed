// The split lane's cut: where each cold expert's intermediate features divide between the GPU (over
// the link) and the peer (from its DRAM). The primary takes a share or the cut its peer published;
// the peer (`tandem peer --split-share`) takes a share, or with auto weighs the link against the
// host's DRAM. Both sides then agree on one column (the lane fingerprint covers it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/thread_pool.h"

namespace tandem {

// --split-share: a share in (0, 1), or nullopt for "auto". InputError naming the flag otherwise.
std::optional<double> parse_split_share(const std::string& value);
// The same check on a share given as a number: InputError "--split-share S: give a share ..." unless
// it is in (0, 1).
void check_split_share(double share);

// The primary's cut for a model of `inter` intermediate features: split_column of `share`, or with
// nullopt (auto) the cut the peer of lane `peer` published, waiting up to timeout_s for it to come up.
// InputError when that peer serves whole experts or a cut outside the model's experts.
int64_t resolve_split_column(std::optional<double> share, const std::string& peer, int64_t inter, double timeout_s);

// What `tandem peer` was asked about the cut.
struct PeerSplitOptions {
  std::string share;          // --split-share: "" or "0" (whole experts: the peer lane), F in (0, 1), or auto
  double link_gbps = 0;       // auto: the link's bandwidth (0: measured from link_device)
  double dram_gbps = 0;       // auto: this host's DRAM read bandwidth (0: measured with the pool)
  std::string link_device = "cuda";  // auto: the primary's GPU whose reads of pinned host memory measure the link
};
// The peer's cut (0: whole experts) for experts of `inter` features. auto measures what link_gbps and
// dram_gbps do not give, before any expert is loaded (the host is quiet then), with `pool`'s threads;
// it is refused for a peer on a GPU (on_gpu). InputError naming the flag at fault.
int64_t choose_peer_split(const PeerSplitOptions& o, bool on_gpu, int64_t inter, ThreadPool& pool);

}  // namespace tandem
