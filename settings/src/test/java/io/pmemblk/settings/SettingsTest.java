package io.pmemblk.settings;

import io.pmemblk.pmem.PmemRegion;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatCode;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class SettingsTest {
    @TempDir
    Path dir;

    @Test
    void defaultsAreTheDocumentedOnes() {
        Settings s = Settings.defaults();
        // auto: where the systemd unit's StateDirectory/RuntimeDirectory are as root, XDG otherwise (DefaultPathsTest)
        int euid = io.pmemblk.posix.Libc.geteuid();
        assertThat(s.text(Keys.PMEM_PATH)).isEqualTo("auto");
        assertThat(s.get(Keys.PMEM_PATH)).isEqualTo(DefaultPaths.pmemPath(euid, System.getenv()));
        assertThat(s.get(Keys.NBD_SOCKET)).isEqualTo(DefaultPaths.socketPath(euid, System.getenv()));
        assertThat(s.get(Keys.NBD_TLS)).isEqualTo(Keys.TlsMode.OFF);
        assertThat(s.get(Keys.NBD_TLS_VERIFY_CLIENTS)).isNull();
        assertThat(s.get(Keys.PMEM_SIZE)).isEqualTo(1L << 30);
        assertThat(s.get(Keys.NBD_PORT)).isEqualTo(10809);
        assertThat(s.get(Keys.NBD_BIND)).isEqualTo("127.0.0.1");
        assertThat(s.get(Keys.NBD_EXPORT)).isEqualTo("pmem0");
        assertThat(s.get(Keys.QUEUES)).isEqualTo(Math.min(8, Runtime.getRuntime().availableProcessors()));
        assertThat(s.get(Keys.QUEUE_DEPTH)).isEqualTo(128);
        assertThat(s.get(Keys.DMA_ENGINE)).isEqualTo(Keys.DmaEngineKind.NONE);
        assertThat(s.get(Keys.METRICS_PORT)).isZero();
        assertThat(s.get(Keys.PMEM_MAPPER)).isEqualTo(Keys.Mapper.AUTO);
    }

    @Test
    void aPropertiesFileCannotSwitchOnFaultInjection(@TempDir Path tmp) throws Exception {
        // The keys that once did (dma.soft.fail-every, dma.soft.break-after) are unknown: faults are test code only.
        for (String key : List.of("dma.soft.fail-every", "dma.soft.break-after")) {
            Path f = tmp.resolve(key + ".properties");
            Files.writeString(f, key + "=40\n");
            assertThatThrownBy(() -> Settings.load(f, List.of())).isInstanceOf(SettingsException.class)
                    .hasMessageContaining(key);
        }
        assertThat(Keys.ALL.keySet()).noneMatch(k -> k.contains("fail") || k.contains("inject") || k.contains("fault"));
    }

    @Test
    void vhostIsOffByDefaultCountsAsAListenerAndNeedsASocketOfItsOwn() throws Exception {
        assertThat(Settings.defaults().get(Keys.VHOST_SOCKET)).isNull();
        Settings only = Settings.load(null, List.of("nbd.socket=", "nbd.port=0", "vhost.socket=/run/v.sock"));
        assertThat(only.get(Keys.VHOST_SOCKET)).isEqualTo(Path.of("/run/v.sock"));
        assertThatThrownBy(() -> Settings.load(null, List.of("nbd.socket=", "nbd.port=0")))
                .hasMessageContaining("no listener would be left");
        assertThatThrownBy(() -> Settings.load(null, List.of("nbd.socket=/run/s", "vhost.socket=/run/s")))
                .hasMessageStartingWith("vhost.socket: '/run/s' is not allowed: it is also nbd.socket");
        assertThatThrownBy(() -> Settings.load(null, List.of("vhost.queues=65")))
                .hasMessage("vhost.queues: '65' is not allowed (from --set); allowed: an integer 1..64");
        assertThatThrownBy(() -> Settings.load(null, List.of("vhost.queue-size=1025")))
                .hasMessageContaining("allowed: an integer 3..1024");
        for (String tooSmall : List.of("1", "2")) { // no virtio-blk request fits: every connection failed at GET_CONFIG
            assertThatThrownBy(() -> Settings.load(null, List.of("vhost.queue-size=" + tooSmall)))
                    .hasMessage("vhost.queue-size: '" + tooSmall + "' is not allowed (from --set); allowed: an integer 3..1024");
        }
        assertThat(Settings.load(null, List.of("vhost.queue-size=3")).get(Keys.VHOST_QUEUE_SIZE)).isEqualTo(3);
    }

    @Test
    void pmemMapperNamesTheDevicesMappersOneForOne() {
        // serve hands the choice to PmemRegion by name: a mapper added or renamed on one side only fails here.
        assertThat(java.util.Arrays.stream(Keys.Mapper.values()).map(Enum::name))
                .containsExactlyElementsOf(java.util.Arrays.stream(PmemRegion.Mapper.values()).map(Enum::name).toList());
    }

    @Test
    void fileThenOverridesInThatOrder() throws Exception {
        Path f = dir.resolve("p.properties");
        Files.writeString(f, "# comment\npmem.size = 2G\nnbd.port=0\nqueues=3\n");
        Settings s = Settings.load(f, List.of("queues=5", "route.dma.min-bytes=64K"));
        assertThat(s.get(Keys.PMEM_SIZE)).isEqualTo(2L << 30);
        assertThat(s.get(Keys.NBD_PORT)).isZero();
        assertThat(s.get(Keys.QUEUES)).isEqualTo(5);
        assertThat(s.get(Keys.ROUTE_DMA_MIN_BYTES)).isEqualTo(65536L);
        assertThat(s.source(Keys.PMEM_SIZE)).isEqualTo(f.toString());
        assertThat(s.source(Keys.QUEUES)).isEqualTo("--set");
    }

    @ParameterizedTest
    @CsvSource(delimiter = '|', value = {
            "pmem.size=12X        | pmem.size: '12X' is not allowed (from --set); allowed: a size",
            "pmem.size=1000       | pmem.size: '1000' is not allowed",
            "nbd.port=70000       | nbd.port: '70000' is not allowed (from --set); allowed: a TCP port 0..65535",
            "queue.depth=0        | queue.depth: '0' is not allowed",
            "dma.engine=ioat      | dma.engine: 'ioat' is not allowed (from --set); allowed: none, soft, vfio or vfio-user",
            "dma.engine=vfio-user | dma.engine=vfio-user needs dma.vfio-user.socket: the socket of the device process",
            "dma.vfio-user.socket=/run/ioat.sock | dma.vfio-user.socket: '/run/ioat.sock' is not allowed with dma.engine=none",
            "dma.vfio.devices=00:02.0 | dma.vfio.devices: '00:02.0' is not allowed (from --set); allowed: auto, or PCI addresses dddd:bb:dd.f separated by commas",
            "dma.engine=gpu       | dma.engine: 'gpu' is not allowed",
            "dma.ring-size=100    | dma.ring-size: '100' is not allowed (from --set); allowed: a power of two",
            "pmem.resize=maybe    | pmem.resize: 'maybe' is not allowed",
            "nbd.export=a b       | nbd.export: 'a b' is not allowed",
            "queue.buffer-bytes=1M| queue.buffer-bytes: '1M' is not allowed",
            "pmem.mapper=mmap     | pmem.mapper: 'mmap' is not allowed (from --set); allowed: auto, libpmem or java",
            "pmem.sizee=1G        | unknown setting 'pmem.sizee' (from --set); did you mean 'pmem.size'? known keys: pmem.path, pmem.size",
            "nbd.prot=1           | unknown setting 'nbd.prot' (from --set); did you mean 'nbd.port'? known keys: pmem.path",
            "queue.dpeth=8        | unknown setting 'queue.dpeth' (from --set); did you mean 'queue.depth'? known keys: pmem.path",
            "NBD.Port=1           | unknown setting 'NBD.Port' (from --set); did you mean 'nbd.port'? known keys: pmem.path",
            "frobnicate=1         | unknown setting 'frobnicate' (from --set); known keys: pmem.path",
            "dma.channels=4       | dma.channels: '4' is not allowed with dma.engine=none: only dma.engine=soft makes channels by this count",
            "novalue              | --set novalue: expected key=value",
            "nbd.tls=yes          | nbd.tls: 'yes' is not allowed (from --set); allowed: off, on or require",
            "nbd.tls=require      | nbd.tls: 'require' needs nbd.tls.certificate and nbd.tls.key; allowed: PEM files",
            "nbd.tls.verify-clients=/etc/ca.pem | nbd.tls.verify-clients: '/etc/ca.pem' is not allowed with nbd.tls=off",
            "log.level=verbose    | log.level: 'verbose' is not allowed (from --set); allowed: error, warning, info, debug or trace",
    })
    void badSettingsAreNamedWithValueAndWhatIsAllowed(String set, String message) {
        assertThatThrownBy(() -> Settings.load(null, List.of(set)))
                .isInstanceOf(SettingsException.class)
                .hasMessageStartingWith(message.trim())
                .satisfies(e -> assertThat(e.getMessage()).doesNotContain("\n"));
    }

    @Test
    void vfioUserTakesItsSocket() throws Exception {
        Settings s = Settings.load(null, List.of("dma.engine=vfio-user", "dma.vfio-user.socket=/run/pmemblk/ioat.sock"));
        assertThat(s.get(Keys.DMA_ENGINE)).isEqualTo(Keys.DmaEngineKind.VFIO_USER);
        assertThat(s.get(Keys.DMA_VFIO_USER_SOCKET)).isEqualTo(Path.of("/run/pmemblk/ioat.sock"));
    }

    @Test
    void unknownKeyInFileNamesTheFile() throws Exception {
        Path f = dir.resolve("bad.properties");
        Files.writeString(f, "nbd.prot=1\n");
        assertThatThrownBy(() -> Settings.load(f, List.of()))
                .hasMessageContaining("unknown setting 'nbd.prot' (from " + f + ")");
    }

    @Test
    void aByteOrderMarkAtTheStartOfTheFileIsNotPartOfTheFirstKey() throws Exception {
        // Notepad's "UTF-8" writes one: the first key was refused as unknown, printed looking exactly like itself.
        Path f = dir.resolve("bom.properties");
        Files.writeString(f, "\uFEFFpmem.size=2G\nnbd.port=0\n");
        Settings s = Settings.load(f, List.of());
        assertThat(s.get(Keys.PMEM_SIZE)).isEqualTo(2L << 30);
        assertThat(s.source(Keys.PMEM_SIZE)).isEqualTo(f.toString());
        // only at the very start: anywhere else it is a character of the text, as the properties format has it
        Files.writeString(f, "nbd.port=0\n\uFEFFpmem.size=2G\n");
        assertThatThrownBy(() -> Settings.load(f, List.of())).hasMessageStartingWith("unknown setting '\uFEFFpmem.size'");
    }

    @Test
    void missingConfigFileIsNamed() {
        assertThatThrownBy(() -> Settings.load(dir.resolve("nope"), List.of()))
                .hasMessageContaining("no such file");
    }

    @Test
    void explicitPathsAndTlsFilesAreTakenAsGiven() throws Exception {
        Settings s = Settings.load(null, List.of("pmem.path=/var/tmp/pmemblk/pmem0.img", "nbd.socket=/tmp/x/nbd.sock",
                "nbd.tls=require", "nbd.tls.certificate=/etc/pmemblk/cert.pem", "nbd.tls.key=/etc/pmemblk/key.pem",
                "nbd.tls.verify-clients=/etc/pmemblk/ca.pem"));
        assertThat(s.get(Keys.PMEM_PATH)).isEqualTo(Path.of("/var/tmp/pmemblk/pmem0.img"));
        assertThat(s.get(Keys.NBD_SOCKET)).isEqualTo(Path.of("/tmp/x/nbd.sock"));
        assertThat(s.get(Keys.NBD_TLS)).isEqualTo(Keys.TlsMode.REQUIRE);
        assertThat(s.get(Keys.NBD_TLS_VERIFY_CLIENTS)).isEqualTo(Path.of("/etc/pmemblk/ca.pem"));
    }

    @Test
    void theLayoutIsRawByDefaultAndBttOnRequestWithItsSectorSize() throws Exception {
        assertThat(Settings.defaults().get(Keys.PMEM_LAYOUT)).isEqualTo(Keys.Layout.RAW);
        Settings btt = Settings.load(null, List.of("pmem.layout=btt", "pmem.sector-size=512"));
        assertThat(btt.get(Keys.PMEM_LAYOUT)).isEqualTo(Keys.Layout.BTT);
        assertThat(btt.get(Keys.PMEM_SECTOR_SIZE)).isEqualTo(512);
        assertThat(Settings.load(null, List.of("pmem.layout=BTT")).get(Keys.PMEM_SECTOR_SIZE)).isEqualTo(4096);
    }

    @Test
    void aWrongLayoutOrSectorSizeIsRefusedNamingTheKeyTheValueAndWhatIsAllowed() {
        assertThatThrownBy(() -> Settings.load(null, List.of("pmem.layout=sector")))
                .hasMessage("pmem.layout: 'sector' is not allowed (from --set); allowed: raw or btt");
        assertThatThrownBy(() -> Settings.load(null, List.of("pmem.layout=btt", "pmem.sector-size=520")))
                .hasMessageStartingWith("pmem.sector-size: '520' is not allowed (from --set); allowed: 512 or 4096");
        assertThatThrownBy(() -> Settings.load(null, List.of("pmem.sector-size=512")))
                .hasMessageStartingWith("pmem.sector-size: '512' is not allowed with pmem.layout=raw")
                .hasMessageContaining("set pmem.layout=btt");
        assertThatThrownBy(() -> Settings.load(null, List.of("pmem.layout=btt", "ublk.block-size=512")))
                .hasMessageStartingWith("ublk.block-size: '512' is not allowed with pmem.layout=btt and"
                        + " pmem.sector-size=4096");
        // the BTT has a DMA route too (a device-written block is made durable before its flog and map steps)
        assertThatCode(() -> Settings.load(null, List.of("pmem.layout=btt", "dma.engine=soft")))
                .doesNotThrowAnyException();
        // vhost-user-blk advertises the BTT's sector as blk_size: 4 KiB sectors are served too
        assertThatCode(() -> Settings.load(null, List.of("pmem.layout=btt", "vhost.socket=/tmp/v.sock")))
                .doesNotThrowAnyException();
    }

    @Test
    void nvmeListenMayNotTakeThePortOfAnotherListener() throws Exception {
        // Both would bind it: serve created pmem.path, then stopped with exit 1 ("Address already in use").
        assertThatThrownBy(() -> Settings.load(null, List.of("nvme.listen=127.0.0.1:10809")))
                .isInstanceOf(SettingsException.class)
                .hasMessage("nvme.listen: '127.0.0.1:10809' is not allowed: its port is also nbd.port;"
                        + " allowed: another port, or empty (off)");
        assertThatThrownBy(() -> Settings.load(null, List.of("metrics.port=4420", "nvme.listen=[::1]:4420")))
                .isInstanceOf(SettingsException.class)
                .hasMessage("nvme.listen: '[::1]:4420' is not allowed: its port is also metrics.port;"
                        + " allowed: another port, or empty (off)");
        assertThat(Settings.load(null, List.of("nbd.port=0", "nvme.listen=127.0.0.1:10809")).get(Keys.NVME_LISTEN).getPort())
                .isEqualTo(10809);
        assertThat(Settings.load(null, List.of("nvme.listen=127.0.0.1:4420")).get(Keys.NVME_LISTEN).getPort())
                .isEqualTo(4420);
    }

    @Test
    void aSocketMayNotBeAnotherSocketOrTheImageHoweverItIsSpelt() {
        // Found only at listen, after pmem.path was opened: serve stopped with exit 1, a new image left behind.
        assertThatThrownBy(() -> Settings.load(null, List.of("nbd.socket=/run/s", "vhost.socket=/run/./s")))
                .isInstanceOf(SettingsException.class)
                .hasMessage("vhost.socket: '/run/./s' is not allowed: it is also nbd.socket; allowed: another path,"
                        + " or empty (off)");
        assertThatThrownBy(() -> Settings.load(null, List.of("pmem.path=/srv/a.img", "nbd.socket=/srv//a.img")))
                .isInstanceOf(SettingsException.class)
                .hasMessage("nbd.socket: '/srv//a.img' is not allowed: it is also pmem.path; allowed: another path,"
                        + " or empty (off)");
        assertThatThrownBy(() -> Settings.load(null, List.of("pmem.path=/srv/a.img", "vhost.socket=/srv/./a.img")))
                .isInstanceOf(SettingsException.class)
                .hasMessage("vhost.socket: '/srv/./a.img' is not allowed: it is also pmem.path; allowed: another path,"
                        + " or empty (off)");
    }

    @Test
    void aNegativeSocketGroupIsNoGroup() {
        // The JDK's lookup takes any int a name service does not know as a gid: -1 was accepted, and chown(2)'s
        // -1 is "leave the group as it is", so the socket was made 0660 for the serving user's own group.
        assertThatThrownBy(() -> Settings.load(null, List.of("vhost.socket=/run/v.sock", "vhost.socket-group=-1")))
                .isInstanceOf(SettingsException.class)
                .hasMessage("vhost.socket-group: '-1' is not allowed (from --set); allowed: a group this system knows,"
                        + " by name or number, or empty for none");
    }

    @Test
    void noListenerAtAllIsRefused() {
        assertThatThrownBy(() -> Settings.load(null, List.of("nbd.socket=", "nbd.port=0")))
                .hasMessageContaining("no listener would be left");
    }

    @Test
    void exampleFileInTheRepositoryDocumentsEveryKeyWithItsDefault() throws Exception {
        Path example = Path.of("..", "pmemblk.properties.example");
        assertThat(Files.readString(example))
                .as("regenerate with: ./scripts/pmemblk config-example > pmemblk.properties.example")
                .isEqualTo(ExampleFile.example());
        // and it loads as it is
        assertThat(Settings.load(example, List.of()).get(Keys.PMEM_SIZE)).isEqualTo(1L << 30);
    }

    @Test
    void changedComparesValuesNotTheirSpelling() throws Exception {
        Settings a = Settings.load(null, List.of("route.dma.min-bytes=256K", "log.level=info"));
        assertThat(a.changed(Settings.load(null, List.of("route.dma.min-bytes=262144", "log.level=INFO")))).isEmpty();
        assertThat(a.changed(Settings.load(null, List.of("route.dma.min-bytes=64K", "pmem.size=2G", "log.level=debug"))))
                .extracting(Key::name).containsExactly("pmem.size", "route.dma.min-bytes", "log.level");
        assertThat(Settings.defaults().get(Keys.LOG_LEVEL)).isEqualTo(Keys.LogLevel.INFO);
    }

    @Test
    void theExampleSaysWhichKeysApplyOnReload() {
        String reload = "# A running server applies a change on reload";
        for (Key<?> k : Keys.ALL.values()) {
            String doc = ExampleFile.example().split("\n" + java.util.regex.Pattern.quote(k.name()) + "=")[0];
            String last = doc.substring(doc.lastIndexOf("\n\n"));
            assertThat(last.contains(reload)).as(k.name()).isEqualTo(Keys.LIVE.contains(k));
        }
    }

    @Test
    void anInstallableExampleSetsItsKeysAndLeavesTheOthersAtTheirDefaults() throws Exception {
        String text = ExampleFile.example(Map.of("pmem.path", "/var/lib/pmemblk/pmemblk.img", "metrics.port", "9710"));
        Path f = dir.resolve("installed.properties");
        Files.writeString(f, text);
        Settings s = Settings.load(f, List.of());
        assertThat(s.get(Keys.PMEM_PATH)).isEqualTo(Path.of("/var/lib/pmemblk/pmemblk.img"));
        assertThat(s.get(Keys.METRICS_PORT)).isEqualTo(9710);
        assertThat(s.source(Keys.PMEM_SIZE)).as("a key left alone keeps the built-in default").isEqualTo("default");
        for (Key<?> k : Keys.ALL.values()) {
            assertThat(text).as(k.name()).containsPattern("(?m)^#?" + java.util.regex.Pattern.quote(k.name()) + "=");
        }
        assertThat(text).contains("# Built-in default: 0\nmetrics.port=9710\n");
        assertThatThrownBy(() -> ExampleFile.example(Map.of("metrics.port", "99999")))
                .hasMessageStartingWith("metrics.port: '99999' is not allowed");
    }

    @ParameterizedTest
    @CsvSource({"4096,4096", "64K,65536", "1m,1048576", "2G,2147483648", "1GiB,1073741824", "3KB,3072"})
    void sizes(String text, long bytes) {
        assertThat(Sizes.parse(text)).isEqualTo(bytes);
        assertThat(Sizes.parse(Sizes.format(bytes))).isEqualTo(bytes);
    }
}
