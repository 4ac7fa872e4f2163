# Runs inside the debootstrapped root (chroot) before `docker import`.
set -eu
# The docker CLI talks to the host's engine through the mounted socket: no engine in the lab Spark.
for unit in docker.service docker.socket containerd.service \
            getty@.service console-getty.service systemd-udevd.service \
            systemd-udev-trigger.service systemd-modules-load.service \
            sys-kernel-config.mount sys-kernel-debug.mount systemd-remount-fs.service \
            systemd-firstboot.service systemd-logind.service; do
    ln -sf /dev/null "/etc/systemd/system/$unit"
done
# A swap entry as a fresh DGX OS install may have: host_tuning must comment it out.
printf '/swap.img\tnone\tswap\tsw\t0\t0\n' >>/etc/fstab
echo 'sparkops-lab' >/etc/hostname
: >/etc/machine-id
# The example inventory's Ansible user (ansible_user: sparkops, ansible_become: true), as on a real
# Spark: a login user with passwordless sudo. Lab Sparks are reached as that user (docker exec -u).
useradd --create-home --shell /bin/bash sparkops
printf 'sparkops ALL=(ALL) NOPASSWD:ALL\n' >/etc/sudoers.d/sparkops
chmod 0440 /etc/sudoers.d/sparkops
