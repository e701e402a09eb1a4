/* Read-only file mappings (mapped_file.h). */
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/mapped_file.h"

ctrl_status ctrl_mapped_file_open(const char *path, size_t min, const char *what, const uint8_t **data,
                                  size_t *size) {
    *data = NULL, *size = 0;
    const int fd = open(path, O_RDONLY);
    struct stat sb;
    ctrl_status st = CTRL_OK;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        st = ctrl_error_set(CTRL_ERR_IO, "%s: cannot open", path);
    } else if ((size_t)sb.st_size < min) {
        st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: not %s (%lld bytes)", path, what, (long long)sb.st_size);
    } else {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            st = ctrl_error_set(CTRL_ERR_IO, "%s: cannot map", path);
        else
            *data = m, *size = (size_t)sb.st_size;
    }
    if (fd >= 0) close(fd);
    return st;
}

void ctrl_mapped_file_close(const uint8_t *data, size_t size) {
    if (data) munmap((void *)(uintptr_t)data, size);
}
