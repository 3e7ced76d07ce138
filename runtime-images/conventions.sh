#!/bin/sh
# The file-system conventions every Debian runtime image keeps, written once (README.md, "All
# images keep the same conventions"; build.sh checks them after every build, and labels each
# image org.aegis.sandbox.user=65534:65534 and org.aegis.sandbox.workspace=/workspace):
# uid and gid 65534 exist, /workspace is a directory owned by 65534:65534 (mode 0755) and /tmp
# is world-writable with the sticky bit. The image's default user stays root: the sandbox
# executor starts as root and steps down to 65534 for every command.
#
# Each Dockerfile copies it in and runs it once, after its packages are installed:
#   COPY conventions.sh /tmp/
#   RUN sh /tmp/conventions.sh [e2b-user] && rm /tmp/conventions.sh
#
#   (no argument)  uid/gid 65534 keep Debian's names (nobody/nogroup); where the base has no
#                  such user or group, they are made as "sandbox" (home /workspace, no login)
#   e2b-user       E2B's templates (base, code-interpreter): uid/gid 65534 are renamed "user",
#                  home /home/user, shell bash, as E2B's SDK and its tests expect (files owned by
#                  "user", paths under /home/user), and no file keeps a set-uid or set-gid bit
#
# The busybox image (FROM scratch: no getent, useradd or find) keeps the same conventions with
# its own /etc/passwd and /etc/group.
set -eux

case "${1:-}" in
  '')
    getent group 65534 >/dev/null || groupadd --gid 65534 sandbox
    getent passwd 65534 >/dev/null || useradd --uid 65534 --gid 65534 --no-create-home \
      --home-dir /workspace --shell /usr/sbin/nologin sandbox
    ;;
  e2b-user)
    sed -i -e 's/^nobody:/user:/' -e 's|^user:\([^:]*\):65534:65534:[^:]*:[^:]*:[^:]*$|user:\1:65534:65534:E2B sandbox user:/home/user:/bin/bash|' /etc/passwd
    sed -i -e 's/^nogroup:/user:/' /etc/group
    sed -i -e 's/^nobody:/user:/' /etc/shadow
    sed -i -e 's/^nogroup:/user:/' /etc/gshadow
    [ "$(getent passwd 65534)" = "user:x:65534:65534:E2B sandbox user:/home/user:/bin/bash" ]
    [ "$(getent group 65534 | cut -d: -f1)" = "user" ]
    install -d -o 65534 -g 65534 -m 0755 /home/user
    find / -xdev -type f -perm /6000 -exec chmod ug-s {} +
    [ -z "$(find / -xdev -type f -perm /6000 -print -quit)" ]
    ;;
  *)
    echo "conventions.sh: unknown variant '$1' (expected none or e2b-user)" >&2
    exit 2
    ;;
esac

install -d -o 65534 -g 65534 -m 0755 /workspace
chmod 1777 /tmp
