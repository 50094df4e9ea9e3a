from __future__ import annotations

from pathlib import Path

from autotune.probes import cgroup, cpu, host_memory
from autotune.probes.cgroup import CgroupMount

FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1 << 30


def root(machine: str) -> str:
    return str(FIXTURES / machine)


# ------------------------------------------------------------- cpu quota parsers

def test_cgroup_v2_cpu_max() -> None:
    assert cgroup.parse_cpu_max("400000 100000\n") == 4.0
    assert cgroup.parse_cpu_max("150000 100000") == 1.5
    assert cgroup.parse_cpu_max("max 100000\n") is None
    assert cgroup.parse_cpu_max("max") is None


def test_cgroup_v1_cfs_quota() -> None:
    assert cgroup.parse_cfs_quota("200000\n", "100000\n") == 2.0
    assert cgroup.parse_cfs_quota("50000", "100000") == 0.5
    assert cgroup.parse_cfs_quota("-1\n", "100000\n") is None


def test_cpu_limit_cores_rounds_up() -> None:
    assert cgroup.cpu_limit_cores(4.0) == 4
    assert cgroup.cpu_limit_cores(0.5) == 1
    assert cgroup.cpu_limit_cores(2.01) == 3
    assert cgroup.cpu_limit_cores(None) is None


# ------------------------------------------------------------- locating cgroups

def test_parse_proc_cgroup_v1_and_v2() -> None:
    text = "11:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/x\n0::/user.slice\n"
    paths = cgroup.parse_proc_cgroup(text)
    assert paths["cpu"] == paths["cpuacct"] == paths["memory"] == "/docker/abc"
    assert paths[""] == "/user.slice"


def test_parse_mountinfo_cgroup_lines_only() -> None:
    text = (FIXTURES / "arm_graviton3/proc/self/mountinfo").read_text()
    mounts = cgroup.parse_mountinfo(text)
    assert all(m.version == 1 for m in mounts)  # the tmpfs line is not a cgroup
    cpu_mount = next(m for m in mounts if "cpu" in m.controllers)
    assert cpu_mount.mount_point == "/sys/fs/cgroup/cpu,cpuacct"
    assert cpu_mount.root.startswith("/docker/")


def test_cgroup_dirs_walk_from_leaf_to_mount() -> None:
    mounts = [CgroupMount("/sys/fs/cgroup", "/", 2, frozenset())]
    dirs = cgroup.cgroup_dirs({"": "/a.slice/b.scope"}, mounts, "cpu")
    assert dirs == ["/sys/fs/cgroup/a.slice/b.scope", "/sys/fs/cgroup/a.slice", "/sys/fs/cgroup"]


def test_cgroup_dirs_docker_v1_without_namespace() -> None:
    mounts = [CgroupMount("/sys/fs/cgroup/memory", "/docker/abc", 1, frozenset({"memory"}))]
    assert cgroup.cgroup_dirs({"memory": "/docker/abc"}, mounts, "memory") == ["/sys/fs/cgroup/memory"]


def test_cgroup_dirs_prefers_v1_controller_on_hybrid_hosts() -> None:
    mounts = [
        CgroupMount("/sys/fs/cgroup/unified", "/", 2, frozenset()),
        CgroupMount("/sys/fs/cgroup/cpu", "/", 1, frozenset({"cpu"})),
    ]
    assert cgroup.cgroup_dirs({"cpu": "/", "": "/"}, mounts, "cpu") == ["/sys/fs/cgroup/cpu"]


# ------------------------------------------------------------- cpu readers on fixtures

def test_cgroup_v2_quota_on_64_core_host_gives_4_usable() -> None:
    info = cpu.read_cpu(root("amd_genoa_nps4"))
    assert info.logical_cores == 64
    assert info.cgroup_cpu_limit == 4.0  # container 4 inside a pod of 8: tightest wins
    assert info.usable_cores == 4
    assert info.usable_cpus == list(range(64))


def test_cgroup_v1_quota_docker() -> None:
    info = cpu.read_cpu(root("arm_graviton3"))
    assert info.cgroup_cpu_limit == 16.0
    assert info.usable_cores == 16


def test_cgroup_max_means_no_limit() -> None:
    info = cpu.read_cpu(root("intel_spr_2s"))
    assert info.cgroup_cpu_limit is None
    assert info.usable_cores == 32  # bounded by the affinity mask only


def test_this_machine_fixture_v1_unlimited() -> None:
    info = cpu.read_cpu(root("local_epyc_kvm"))
    assert info.cgroup_cpu_limit is None  # cpu.cfs_quota_us == -1
    assert info.usable_cores == 2


def test_parent_quota_caps_unlimited_child(write_root) -> None:
    fake = write_root({
        "/proc/self/cgroup": "0::/outer/inner\n",
        "/proc/self/status": "Cpus_allowed_list:\t0-63\n",
        "/proc/cpuinfo": "".join(f"processor\t: {i}\nflags\t: lm avx2\n\n" for i in range(64)),
        "/sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
        "/sys/fs/cgroup/outer/cpu.max": "200000 100000\n",
        "/sys/fs/cgroup/outer/inner/cpu.max": "max 100000\n",
    })
    info = cpu.read_cpu(fake)  # no mountinfo: the standard v2 layout is assumed
    assert info.cgroup_cpu_limit == 2.0 and info.usable_cores == 2


def test_v1_quota_without_mountinfo(write_root) -> None:
    fake = write_root({
        "/proc/self/cgroup": "3:cpu,cpuacct:/\n",
        "/proc/self/status": "Cpus_allowed_list:\t0-7\n",
        "/proc/cpuinfo": "".join(f"processor\t: {i}\n\n" for i in range(8)),
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "300000\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cpu.read_cpu(fake).usable_cores == 3


# ------------------------------------------------------------- memory

def test_memory_limit_parsing() -> None:
    assert cgroup.parse_memory_max("max\n") is None
    assert cgroup.parse_memory_max("17179869184\n") == 16 * GiB
    assert cgroup.parse_memory_limit_in_bytes("9223372036854771712\n") is None  # 4K-page sentinel
    assert cgroup.parse_memory_limit_in_bytes("9223372036854710272") is None  # 64K-page sentinel
    assert cgroup.parse_memory_limit_in_bytes("34359738368") == 32 * GiB


def test_meminfo_parser() -> None:
    info = host_memory.parse_meminfo("MemTotal:  1024 kB\nMemAvailable:   512 kB\nHugePages_Total:  0\n")
    assert info == {"MemTotal": 1 << 20, "MemAvailable": 512 << 10, "HugePages_Total": 0}


def test_usable_is_min_of_available_and_cgroup_headroom() -> None:
    level = host_memory.CgroupMemoryLevel(limit=16 * GiB, usage=6 * GiB, inactive_file=2 * GiB)
    info = host_memory.summarize_memory(total=256 * GiB, available=200 * GiB, levels=[level])
    assert info.cgroup_limit_bytes == 16 * GiB
    assert info.usable_bytes == 12 * GiB  # 16 - (6 - 2 reclaimable)
    roomy = host_memory.summarize_memory(total=8 * GiB, available=3 * GiB, levels=[level])
    assert roomy.usable_bytes == 3 * GiB  # host is tighter than the cgroup


def test_no_cgroup_limit_means_available() -> None:
    info = host_memory.summarize_memory(total=8 * GiB, available=5 * GiB, levels=[host_memory.CgroupMemoryLevel(None, GiB)])
    assert info.cgroup_limit_bytes is None and info.usable_bytes == 5 * GiB


def test_memory_v2_pod_hierarchy_fixture() -> None:
    info = host_memory.read_memory(root("amd_genoa_nps4"))
    assert info.total_bytes == 395945628 * 1024
    assert info.cgroup_limit_bytes == 16 * GiB
    assert info.usable_bytes == 13 * GiB  # container: 16 GiB - (4 - 1) GiB working set


def test_memory_v1_docker_fixture() -> None:
    info = host_memory.read_memory(root("arm_graviton3"))
    assert info.cgroup_limit_bytes == 32 * GiB
    assert info.cgroup_usage_bytes == 6 * GiB
    assert info.usable_bytes == 28 * GiB  # total_inactive_file (2 GiB) is reclaimable


def test_memory_unlimited_fixtures() -> None:
    for machine in ("intel_spr_2s", "local_epyc_kvm"):
        info = host_memory.read_memory(root(machine))
        assert info.cgroup_limit_bytes is None, machine
        assert info.usable_bytes == info.available_bytes, machine
