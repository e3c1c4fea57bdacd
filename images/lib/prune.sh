# kf_prune_archives DIR NAME KEEP: of the cached archives DIR/NAME-<16 hex>.tar, keep the KEEP most recently used
# (modification time: images/build.sh touches an archive each time it hands it out) and remove the rest. Every
# source change makes a new operator and runtime archive (the runtime's is ~1.1 GB), so without this the cache only
# grows. Other names, other patterns (NAME-gpu-..., unfinished .tar.new) are never touched.
kf_prune_archives() {
  local dir="$1" name="$2" keep="$3" f n=0
  [[ "$keep" =~ ^[0-9]+$ ]] && [ "$keep" -ge 1 ] || { echo "kf_prune_archives: KEEP must be >= 1, got '$keep'" >&2; return 2; }
  while IFS= read -r f; do
    [[ "$(basename "$f")" =~ ^${name}-[0-9a-f]{16}\.tar$ ]] || continue
    n=$((n + 1))
    if [ "$n" -gt "$keep" ]; then rm -f -- "$f"; fi
  done < <(ls -t -- "$dir"/"$name"-*.tar 2>/dev/null)
}
