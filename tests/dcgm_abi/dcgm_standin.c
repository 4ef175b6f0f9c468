/*
 * A stand-in for DCGM's client library, libdcgm.so.4, for tests without a GPU or a hostengine.
 *
 * It exports the entry points gpu-exporter's DCGM source calls, with the signatures, struct
 * layouts, struct versions (MAKE_DCGM_VERSION: sizeof | version << 24), return codes and blank
 * sentinels of DCGM 4.x's public headers (dcgm_agent.h, dcgm_structs.h, dcgm_fields.h). The
 * declarations below are written from those headers' documented layouts; nothing is included
 * from DCGM.
 *
 * The "hostengine" is a key = value file named by DCGM_STANDIN_CONFIG, re-read on every call:
 *   hostengine = up | down          down: dcgmConnect_v2 and every call on a handle fail with
 *                                   DCGM_ST_CONNECTION_NOT_VALID (a hostengine that went away)
 *   gpus = N                        GPU ids 0..N-1 (dcgmGetAllDevices)
 *   value.<entityGroup>.<entityId>.<fieldId> = x    a double; absent: DCGM_FP64_BLANK with
 *                                   status DCGM_ST_NO_DATA
 *   refuse.<fieldId> = 1            the field reads DCGM_FP64_NOT_SUPPORTED, status
 *                                   DCGM_ST_NOT_SUPPORTED
 * Calls are counted in the file named by DCGM_STANDIN_STATUS (key = count), when set.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int dcgmReturn_t;
typedef uintptr_t dcgmHandle_t;
typedef unsigned int dcgm_field_eid_t;
typedef int dcgm_field_entity_group_t; /* an enum in dcgm_fields.h */

enum {
    DCGM_ST_OK = 0,
    DCGM_ST_BADPARAM = -1,
    DCGM_ST_VER_MISMATCH = -12,
    DCGM_ST_NO_DATA = -14,
    DCGM_ST_NOT_SUPPORTED = -6,
    DCGM_ST_CONNECTION_NOT_VALID = -21,
    DCGM_ST_UNINITIALIZED = -10,
};

#define DCGM_MAX_NUM_DEVICES 32
#define DCGM_MAX_STR_LENGTH 256
#define DCGM_MAX_BLOB_LENGTH 4096
#define DCGM_FT_DOUBLE 'd'
#define DCGM_FP64_BLANK 140737488355328.0
#define DCGM_FP64_NOT_SUPPORTED (DCGM_FP64_BLANK + 2.0)
#define MAKE_DCGM_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((unsigned long)(ver) << 24U)))

typedef struct {
    unsigned int version;
    unsigned int persistAfterDisconnect;
    unsigned int timeoutMs;
    unsigned int addressIsUnixSocket;
} dcgmConnectV2Params_v2;
#define dcgmConnectV2Params_version2 MAKE_DCGM_VERSION(dcgmConnectV2Params_v2, 2)

typedef struct {
    dcgm_field_entity_group_t entityGroupId;
    dcgm_field_eid_t entityId;
} dcgmGroupEntityPair_t;

typedef struct {
    unsigned int version;
    dcgm_field_entity_group_t entityGroupId;
    dcgm_field_eid_t entityId;
    unsigned short fieldId;
    unsigned short fieldType;
    int status;
    unsigned int unused;
    int64_t ts;
    union {
        int64_t i64;
        double dbl;
        char str[DCGM_MAX_STR_LENGTH];
        char blob[DCGM_MAX_BLOB_LENGTH];
    } value;
} dcgmFieldValue_v2;
#define dcgmFieldValue_version2 MAKE_DCGM_VERSION(dcgmFieldValue_v2, 2)

_Static_assert(sizeof(dcgmFieldValue_v2) == 4128, "dcgmFieldValue_v2 layout");
_Static_assert(sizeof(dcgmConnectV2Params_v2) == 16, "dcgmConnectV2Params_v2 layout");

static int initialised;
static dcgmHandle_t next_handle = 1;

/* The configured value of `key`, or NULL; `buf` holds it. */
static const char *config(const char *key, char *buf, size_t len) {
    const char *path = getenv("DCGM_STANDIN_CONFIG");
    if (!path) return NULL;
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char line[512];
    const char *found = NULL;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0) continue;
        const char *p = line + klen;
        while (*p == ' ') p++;
        if (*p != '=') continue;
        p++;
        while (*p == ' ') p++;
        snprintf(buf, len, "%s", p);
        buf[strcspn(buf, "\r\n")] = 0;
        found = buf;
    }
    fclose(f);
    return found;
}

static void count(const char *call) {
    const char *path = getenv("DCGM_STANDIN_STATUS");
    if (!path) return;
    char buf[64];
    char key[80];
    snprintf(key, sizeof key, "%s", call);
    long n = 0;
    FILE *f = fopen(path, "r");
    char lines[64][96];
    int nlines = 0;
    if (f) {
        char line[96];
        while (nlines < 64 && fgets(line, sizeof line, f)) {
            size_t k = strlen(key);
            if (strncmp(line, key, k) == 0 && line[k] == ' ') {
                n = strtol(line + k + 3, NULL, 10);
                continue;
            }
            snprintf(lines[nlines++], sizeof lines[0], "%s", line);
        }
        fclose(f);
    }
    f = fopen(path, "w");
    if (!f) return;
    for (int i = 0; i < nlines; i++) fputs(lines[i], f);
    snprintf(buf, sizeof buf, "%ld", n + 1);
    fprintf(f, "%s = %s\n", key, buf);
    fclose(f);
}

static int hostengine_up(void) {
    char buf[32];
    const char *v = config("hostengine", buf, sizeof buf);
    return !v || strcmp(v, "down") != 0;
}

API dcgmReturn_t dcgmInit(void) {
    count("dcgmInit");
    initialised = 1;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmShutdown(void) {
    count("dcgmShutdown");
    initialised = 0;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmConnect_v2(const char *ipAddress, dcgmConnectV2Params_v2 *params,
                                dcgmHandle_t *handle) {
    count("dcgmConnect_v2");
    if (!initialised) return DCGM_ST_UNINITIALIZED;
    if (!ipAddress || !params || !handle) return DCGM_ST_BADPARAM;
    if (params->version != dcgmConnectV2Params_version2) return DCGM_ST_VER_MISMATCH;
    if (!hostengine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    *handle = next_handle++;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmDisconnect(dcgmHandle_t handle) {
    count("dcgmDisconnect");
    return handle ? DCGM_ST_OK : DCGM_ST_BADPARAM;
}

API dcgmReturn_t dcgmGetAllDevices(dcgmHandle_t handle, unsigned int gpuIdList[DCGM_MAX_NUM_DEVICES],
                                   int *count_out) {
    count("dcgmGetAllDevices");
    if (!handle || !gpuIdList || !count_out) return DCGM_ST_BADPARAM;
    if (!hostengine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    char buf[32];
    const char *v = config("gpus", buf, sizeof buf);
    int n = v ? atoi(v) : 0;
    if (n > DCGM_MAX_NUM_DEVICES) n = DCGM_MAX_NUM_DEVICES;
    for (int i = 0; i < n; i++) gpuIdList[i] = (unsigned int)i;
    *count_out = n;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmEntitiesGetLatestValues(dcgmHandle_t handle, dcgmGroupEntityPair_t entities[],
                                             unsigned int entityCount, unsigned short fields[],
                                             unsigned int fieldCount, unsigned int flags,
                                             dcgmFieldValue_v2 values[]) {
    (void)flags;
    count("dcgmEntitiesGetLatestValues");
    if (!handle || !entities || !fields || !values) return DCGM_ST_BADPARAM;
    if (!hostengine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    for (unsigned int e = 0; e < entityCount; e++) {
        for (unsigned int f = 0; f < fieldCount; f++) {
            dcgmFieldValue_v2 *out = &values[e * fieldCount + f];
            if (out->version != dcgmFieldValue_version2) return DCGM_ST_VER_MISMATCH;
            memset(&out->entityGroupId, 0, sizeof *out - sizeof out->version);
            out->entityGroupId = entities[e].entityGroupId;
            out->entityId = entities[e].entityId;
            out->fieldId = fields[f];
            out->fieldType = DCGM_FT_DOUBLE;
            out->ts = 1700000000000000LL;
            char key[96];
            char buf[64];
            snprintf(key, sizeof key, "refuse.%u", fields[f]);
            if (config(key, buf, sizeof buf)) {
                out->status = DCGM_ST_NOT_SUPPORTED;
                out->value.dbl = DCGM_FP64_NOT_SUPPORTED;
                continue;
            }
            snprintf(key, sizeof key, "value.%d.%u.%u", entities[e].entityGroupId, entities[e].entityId,
                     fields[f]);
            const char *v = config(key, buf, sizeof buf);
            if (v) {
                out->status = DCGM_ST_OK;
                out->value.dbl = strtod(v, NULL);
            } else {
                out->status = DCGM_ST_NO_DATA;
                out->value.dbl = DCGM_FP64_BLANK;
            }
        }
    }
    return DCGM_ST_OK;
}
